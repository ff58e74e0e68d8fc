"""Python runs this at the start of every process that has this folder on
``PYTHONPATH`` (an engine-free run puts it there: ``carrier_harness.engine_free``):
the process ends, saying why, where it would build a ``VllmConfig``."""

try:
    from carrier_harness import engine_free
except ImportError:  # a process started without the development helpers on its path
    engine_free = None

if engine_free is not None and engine_free.active():
    engine_free.refuse_engines(engine_free.exit_process)
