"""What vLLM chooses for Spark2_5 depends on the CPU's class (AVX2, AVX-512,
AVX-512 with BF16, AMX): its kernel library, torch's dispatch, the kernels of
bfloat16 projections, attention and quantized layers, and what the carrier
refuses. Each is pinned to the class this process runs as (the machine's, or the
one ``scripts/as-cpu-class`` emulates; CI runs this under every class below its
machine's), so a new dependence fails here by name instead of on the next machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from carrier_harness import cpu_classes
from spark2_5_dev import kernel_choices
from spark2_5_dev.drivers import run_driver
from spark2_5_dev.quantize import FORMATS

pytestmark = [pytest.mark.kernels, pytest.mark.contract]

IN_FORCE = cpu_classes.class_in_force()


@pytest.fixture(scope="module")
def chosen(tmp_path_factory) -> dict:
    workdir = tmp_path_factory.mktemp("kernel-choices")
    return run_driver("spark2_5_dev.kernel_choices", [], workdir, timeout=600)


@pytest.mark.skipif(IN_FORCE is None, reason="this CPU is below AVX2: vLLM has no kernels for it")
def test_vllm_loads_the_classes_kernel_library_and_torch_dispatches_for_it(chosen):
    assert chosen["kernel_libraries"] == [f"{IN_FORCE.vllm_kernels}.abi3.so"], IN_FORCE
    assert chosen["torch_capability"] == IN_FORCE.aten_capability.upper()


@pytest.mark.skipif(
    IN_FORCE is None or IN_FORCE.name not in kernel_choices.EXPECTED,
    reason=f"no machine of class {IN_FORCE and IN_FORCE.name} measured its choices yet",
)
def test_each_layer_computes_with_the_classes_kernels(chosen):
    expected = kernel_choices.EXPECTED[IN_FORCE.name]
    assert chosen["bfloat16"]["answers"]
    assert tuple(chosen["bfloat16"]["projections"]) == expected.projections
    assert tuple(chosen["bfloat16"]["attention"]) == expected.attention
    for fmt in FORMATS:
        if expected.quantized[fmt] is None:
            refusal = chosen[fmt].get("refused", "")
            assert "Serve a bfloat16 or W8A8 int8 checkpoint" in refusal, (fmt, chosen[fmt])
            continue
        assert tuple(chosen[fmt]["kernels"]) == expected.quantized[fmt], (fmt, chosen[fmt])
        assert chosen[fmt]["answers"], fmt


def _python_as(name: str, code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **cpu_classes.subprocess_env(name)}
    for variable in cpu_classes.narrowing(cpu_classes.CLASSES[0]):  # this process's own
        env.pop(variable, None)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


@pytest.mark.parametrize("lower", [c.name for c in cpu_classes.classes_below(IN_FORCE)])
def test_a_process_runs_as_a_lower_class_and_says_so(lower):
    """Every Python process started under ``subprocess_env`` narrows torch's probes,
    its dispatch and oneDNN before torch loads, and names the class on stderr."""
    target = cpu_classes.CLASSES[cpu_classes.NAMES.index(lower)]
    code = (
        "import json, os, torch; print(json.dumps([torch.backends.cpu.get_cpu_capability(), "
        "os.environ['ONEDNN_MAX_CPU_ISA'], "
        f"[p for p in {cpu_classes.PROBES!r} if getattr(torch.cpu, p)()]]))"
    )
    done = _python_as(lower, code)
    assert done.returncode == 0, done.stderr
    capability, onednn, answering_yes = json.loads(done.stdout)
    assert (capability, onednn) == (target.aten_capability.upper(), target.onednn_max_isa)
    assert set(answering_yes) <= target.probes
    assert f"runs as CPU class {lower} on this" in done.stderr


@pytest.mark.skipif(not cpu_classes.classes_below(IN_FORCE), reason="no class below this CPU's")
@pytest.mark.parametrize("python", ["the project's", "one without the project"])
def test_a_python_runs_as_the_class_importing_nothing_of_the_project(python, tmp_path):
    """Set-up's interpreters, started before the project is installed, narrow torch's
    probes too, without an import error; and no process imports a project module for
    the emulation (the default-off test counts them)."""
    lower = cpu_classes.classes_below(IN_FORCE)[0]
    stand_in = tmp_path / "torch"
    stand_in.mkdir()
    (stand_in / "__init__.py").write_text("")
    (stand_in / "cpu.py").write_text("def _is_avx512_supported():\n    return True\n")
    env = {**os.environ, **cpu_classes.subprocess_env(lower.name)}
    env["PYTHONPATH"] += os.pathsep + str(tmp_path)
    executable = sys.executable if python == "the project's" else sys._base_executable
    code = (
        "import sys, torch.cpu; print(torch.cpu._is_avx512_supported(), "
        "[m for m in sys.modules if m.startswith('vllm')])"
    )
    done = subprocess.run([executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and "Error" not in done.stderr, done.stderr
    assert done.stdout.split(" ", 1) == [str("_is_avx512_supported" in lower.probes), "[]\n"]


def test_a_class_above_the_machines_ends_the_process_naming_it():
    machine = cpu_classes.machine_class()
    if machine == cpu_classes.CLASSES[-1]:
        pytest.skip("this CPU has the highest class")
    above = cpu_classes.CLASSES[cpu_classes.CLASSES.index(machine) + 1 if machine else 0]
    done = _python_as(above.name, "print('ran')")
    assert done.returncode == 2 and "ran" not in done.stdout
    assert f"'{above.name}' is above this CPU's class" in done.stderr


def test_an_unknown_class_ends_the_process_naming_the_classes():
    done = _python_as("avx3", "print('ran')")
    assert done.returncode == 2 and "ran" not in done.stdout
    assert "'avx3' is no CPU class; use one of avx2, avx512, avx512_bf16, amx" in done.stderr
