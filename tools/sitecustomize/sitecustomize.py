"""Python runs this at the start of every process that has this folder and
``tools/dev`` on ``PYTHONPATH``: the development harness's hooks for each process,
each when its variable asks. The process runs as the CPU class its environment
names (``tools/dev/carrier_harness/cpu_classes.py``, ``scripts/as-cpu-class``); in
an engine-free run it stops where it would build a vLLM engine's config
(``carrier_harness.engine_free``). One file for both: Python imports only the first
``sitecustomize`` on its path."""

from carrier_harness import cpu_classes, engine_free

cpu_classes.emulate_from_environment()
if engine_free.active():
    engine_free.refuse_engines(engine_free.exit_process)
