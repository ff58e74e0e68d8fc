"""Python runs this at the start of every process that has this folder on
``PYTHONPATH`` (``scripts/as-cpu-class`` puts it there, with ``tools/dev``): the
process runs as the CPU class its environment names
(``tools/dev/carrier_harness/cpu_classes.py``)."""

from carrier_harness import cpu_classes

cpu_classes.emulate_from_environment()
