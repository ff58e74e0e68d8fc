"""Development helpers shared by every carrier's tests, benchmarks and evidence.

Not shipped in the wheel: ``scripts/setup-env`` puts ``tools/dev`` on the
development environment's path. Knows no carrier.
"""
