"""Development helpers for the Spark2_5 carrier: tiny checkpoints, the trained
fixture, the independent reference, parity, the demo and the evidence run.

Not shipped in the wheel: ``scripts/setup-env`` puts this folder's parent on the
development environment's path. Importing most modules needs torch and
transformers; the carrier's entry point never imports this package.
"""
