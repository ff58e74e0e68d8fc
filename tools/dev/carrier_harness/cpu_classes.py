"""The x86 CPU classes that choose vLLM's CPU kernels, this machine's class, and
how a process runs as a lower one.

Three things pick kernels by CPU, each from its own probe: vLLM's CPU build loads
one of three kernel libraries by torch's ISA probes (``torch.cpu._is_avx512_*``,
``_is_amx_*``), torch dispatches its own kernels by ``ATEN_CPU_CAPABILITY``
(TorchInductor's generated code too), and oneDNN, inside torch and inside each
vLLM library, picks primitives up to ``ONEDNN_MAX_CPU_ISA``. A process runs as a
lower class than its CPU when all three are narrowed before torch loads:
``tools/sitecustomize/sitecustomize.py`` does it in every process that has that
folder and ``tools/dev`` on ``PYTHONPATH`` and :data:`EMULATION_ENV` set
(:func:`subprocess_env`; ``scripts/as-cpu-class`` for any command). Only narrowing
is possible: the CPU must run the class.

    python tools/dev/carrier_harness/cpu_classes.py machine  # this CPU's class
    python tools/dev/carrier_harness/cpu_classes.py below    # the classes it can run as
    python tools/dev/carrier_harness/cpu_classes.py run CLASS COMMAND...  # scripts/as-cpu-class
    python tools/dev/carrier_harness/cpu_classes.py each-below COMMAND...  # each lower class
"""

from __future__ import annotations

import getpass
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

EMULATION_ENV = "EMULATED_CPU_CLASS"
# What a process running as a class needs on its path: the sitecustomize and this module.
PATHS = (
    str(Path(__file__).resolve().parents[2] / "sitecustomize"),
    str(Path(__file__).resolve().parents[1]),
)
# torch.cpu's ISA probes that vLLM reads to choose kernels, attention and GEMM paths.
PROBES = (
    "_is_avx512_supported",
    "_is_vnni_supported",
    "_is_avx512_bf16_supported",
    "_is_amx_tile_supported",
    "_is_amx_fp16_supported",
)


@dataclass(frozen=True)
class CpuClass:
    name: str
    # /proc/cpuinfo flags every CPU of the class has (those of the classes below included).
    flags: frozenset[str]
    aten_capability: str
    onednn_max_isa: str
    # The PROBES a CPU of the class answers yes to (at most: AMX-FP16 is newer than AMX).
    probes: frozenset[str]
    vllm_kernels: str
    examples: str


def _classes() -> tuple[CpuClass, ...]:
    avx2 = {"avx2", "fma", "f16c"}
    avx512 = avx2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq"}
    bf16 = avx512 | {"avx512_vnni", "avx512_bf16"}
    amx = bf16 | {"amx_tile", "amx_bf16", "amx_int8"}
    yes_bf16 = {"_is_avx512_supported", "_is_vnni_supported", "_is_avx512_bf16_supported"}
    return (
        CpuClass(
            "avx2", frozenset(avx2), "avx2", "AVX2", frozenset(), "_C_AVX2",
            "Zen 2 and 3, Haswell to Comet Lake, most laptops",
        ),
        CpuClass(
            "avx512", frozenset(avx512), "avx512", "AVX512_CORE",
            frozenset({"_is_avx512_supported"}), "_C_AVX512",
            "Skylake-SP to Ice Lake Xeons",
        ),
        CpuClass(
            "avx512_bf16", frozenset(bf16), "avx512", "AVX512_CORE_BF16",
            frozenset(yes_bf16), "_C", "Cooper Lake, Zen 4 and 5",
        ),
        CpuClass(
            "amx", frozenset(amx), "avx512", "AVX512_CORE_AMX",
            frozenset(PROBES), "_C", "Sapphire Rapids and later Xeons",
        ),
    )  # fmt: skip


CLASSES = _classes()
NAMES = tuple(cpu_class.name for cpu_class in CLASSES)


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def machine_class(flags: frozenset[str] | None = None) -> CpuClass | None:
    """The highest class whose flags this CPU has; None below AVX2 (no vLLM CPU kernels)."""
    flags = cpu_flags() if flags is None else flags
    fitting = [cpu_class for cpu_class in CLASSES if cpu_class.flags <= flags]
    return fitting[-1] if fitting else None


def classes_below(machine: CpuClass | None) -> tuple[CpuClass, ...]:
    return CLASSES[: CLASSES.index(machine)] if machine else ()


def chosen(name: str, machine: CpuClass | None) -> CpuClass:
    """The class ``name``, if this machine can run as it; else ValueError naming the fix."""
    if name not in NAMES:
        raise ValueError(f"{EMULATION_ENV}={name!r} is no CPU class; use one of {', '.join(NAMES)}")
    target = CLASSES[NAMES.index(name)]
    if machine is None or CLASSES.index(target) > CLASSES.index(machine):
        raise ValueError(
            f"{EMULATION_ENV}={name!r} is above this CPU's class "
            f"({machine.name if machine else 'below avx2'}); a process can only run as a "
            f"lower class: {', '.join(c.name for c in classes_below(machine)) or 'none'}"
        )
    return target


def narrowing(target: CpuClass) -> dict[str, str]:
    """The variables torch and oneDNN read once, when they load, to choose kernels."""
    return {
        "ATEN_CPU_CAPABILITY": target.aten_capability,
        "ONEDNN_MAX_CPU_ISA": target.onednn_max_isa,
    }


def compiled_code_caches(target: CpuClass, user_cache: Path) -> dict[str, str]:
    """Caches of code compiled for one ISA, one per class: a kernel compiled for the
    machine's ISA must not be loaded by a process that runs as a lower class."""
    return {
        "TORCHINDUCTOR_CACHE_DIR": str(
            Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}_as_{target.name}"
        ),
        "VLLM_CACHE_ROOT": str(user_cache / f"vllm-as-{target.name}"),
    }


def subprocess_env(name: str) -> dict[str, str]:
    """The variables that make a child process (and its children) run as class ``name``."""
    inherited = [path for path in os.environ.get("PYTHONPATH", "").split(os.pathsep) if path]
    paths = [*PATHS, *(path for path in inherited if path not in PATHS)]
    return {EMULATION_ENV: name, "PYTHONPATH": os.pathsep.join(paths)}


def class_in_force() -> CpuClass | None:
    """The class this process runs as: the one it emulates, else the machine's."""
    machine = machine_class()
    name = os.environ.get(EMULATION_ENV)
    return chosen(name, machine) if name else machine


def _narrow_probes(torch_cpu, target: CpuClass, machine: CpuClass) -> None:
    for probe in PROBES:
        if probe not in target.probes and hasattr(torch_cpu, probe):
            setattr(torch_cpu, probe, lambda: False)
    print(
        f"cpu_classes: pid {os.getpid()} runs as CPU class {target.name} on this "
        f"{machine.name} CPU: vLLM loads {target.vllm_kernels}, ATEN_CPU_CAPABILITY="
        f"{target.aten_capability}, ONEDNN_MAX_CPU_ISA={target.onednn_max_isa}",
        file=sys.stderr,
    )


def emulate(name: str) -> CpuClass | None:
    """Make this process run as class ``name``: call before torch is imported. Returns
    the class emulated, or None where it is the machine's own (nothing to narrow)."""
    machine = machine_class()
    target = chosen(name, machine)
    if target == machine:
        return None
    os.environ.update(narrowing(target))
    user_cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    for variable, value in compiled_code_caches(target, user_cache).items():
        os.environ.setdefault(variable, value)  # a test's own cache stays its own
    from carrier_harness.import_hook import after_import

    after_import(("torch.cpu",), lambda module: _narrow_probes(module, target, machine))
    return target


def emulate_from_environment() -> None:
    """:func:`emulate` the class :data:`EMULATION_ENV` names, if any. A class this CPU
    cannot run as ends the process: running on the machine's own kernels instead
    would pass for the class."""
    name = os.environ.get(EMULATION_ENV)
    if not name:
        return
    try:
        emulate(name)
    except ValueError as error:
        print(f"cpu_classes: {error}", file=sys.stderr)
        os._exit(2)


def _run_as(name: str, command: list[str]) -> int:
    try:
        chosen(name, machine_class())
    except ValueError as error:
        print(f"as-cpu-class: {error}", file=sys.stderr)
        return 2
    if not command:
        print(f"as-cpu-class: no command given to run as {name}", file=sys.stderr)
        return 2
    os.execvpe(command[0], command, {**os.environ, **subprocess_env(name)})


def _run_as_each_lower_class(command: list[str]) -> int:
    """``command`` once per class below the machine's, lowest first; every run happens,
    and the summary names each class and its exit status."""
    machine = machine_class()
    statuses = {}
    for cpu_class in classes_below(machine):
        print(f"=== as-cpu-class: {' '.join(command)} as CPU class {cpu_class.name}", flush=True)
        env = {**os.environ, **subprocess_env(cpu_class.name)}
        statuses[cpu_class.name] = subprocess.run(command, env=env).returncode
    ran = ", ".join(f"{name} (exit {status})" for name, status in statuses.items())
    print(
        f"as-cpu-class: this machine's class is {machine.name if machine else 'below avx2'}; "
        f"ran {' '.join(command)} as {ran or 'no lower class'}"
    )
    return max(statuses.values(), default=0)


def main(argv: list[str]) -> int:
    machine = machine_class()
    if argv == ["machine"]:
        print(machine.name if machine else "below-avx2")
    elif argv == ["below"]:
        print("\n".join(cpu_class.name for cpu_class in classes_below(machine)))
    elif len(argv) >= 2 and argv[0] == "run":
        return _run_as(argv[1], argv[2:])
    elif len(argv) >= 2 and argv[0] == "each-below":
        return _run_as_each_lower_class(argv[1:])
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
