"""A second carrier added the way docs/adding-a-carrier.md says, touching no toolkit file.

The test copies the repository to a temporary folder, scaffolds a throwaway
carrier there (its package with a trivial ``register``, its bundle package, its
``[[bundle]]`` in manifest.toml, its entry points in pyproject.toml), renders,
builds and installs the wheel into a scratch folder, and checks in a fresh
interpreter that both bundles are discovered and valid and that each carrier's
switch enables only itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from carrier_harness.env import clean_env
from carrier_harness.project import PROJECT_ROOT, copy_project
from vllm_hust_bundle_kit.contract import ENABLED_BUNDLES_ENVS
from vllm_spark2_5_plugin import carrier_switch

DEMO_ID = "org.example.demo-carrier"
DEMO_SWITCH = "DEMO_CARRIER_ENABLE"

DEMO_PACKAGE = '''
"""A carrier that registers nothing: the smallest thing the toolkit can carry."""

from vllm_hust_bundle_kit.entry import carrier_entry_point
from vllm_hust_bundle_kit.switch import CarrierSwitch


def _switch():
    return CarrierSwitch.from_bundle_package(
        "demo_carrier.bundles.demo",
        carrier="demo_carrier:register",
        override_env="DEMO_CARRIER_OVERRIDE",
    )


def _register_enabled(decision):
    return ["registered=nothing"]


register = carrier_entry_point(
    name="demo-carrier",
    logger_name="vllm.demo_carrier",
    load_switch=_switch,
    register_enabled=_register_enabled,
)
'''

DEMO_BUNDLE = f"""

[[bundle]]
extension_id = "{DEMO_ID}"
kind = "in_process_plugin"
lifecycle_owner = "vllm"
requires_services = []

[bundle.host]
provider = "vllm"
name = "vllm"
version_range = ">=0.32.0,<0.33"
verified_on = ["0.32.0+cpu"]

[bundle.runtime]
type = "python"
process_scope = "vllm_processes"
isolation = "trusted_in_process"

[[bundle.protocols]]
name = "vllm.general_plugins"

[[bundle.carriers]]
module = "demo_carrier"
object = "register"
status = "active"
evidence = ["extensions/demo_carrier/evidence/README.md"]

[bundle.activation]
entry_points = [{{ group = "vllm.general_plugins", name = "demo_carrier" }}]
environment = {{ {DEMO_SWITCH} = "1" }}
"""


def run(argv, **kwargs) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=600, env=clean_env(), **kwargs
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def add_demo_carrier(root: Path) -> None:
    """The steps of docs/adding-a-carrier.md, on the copy at ``root``."""
    package = root / "src" / "demo_carrier"
    (package / "bundles" / "demo").mkdir(parents=True)
    (package / "__init__.py").write_text(DEMO_PACKAGE.lstrip(), encoding="utf-8")
    (package / "bundles" / "__init__.py").write_text("", encoding="utf-8")
    evidence = root / "extensions" / "demo_carrier" / "evidence"
    evidence.mkdir(parents=True)
    (evidence / "README.md").write_text("Evidence of the demo carrier.\n", encoding="utf-8")
    with open(root / "manifest.toml", "a", encoding="utf-8") as manifest:
        manifest.write(DEMO_BUNDLE)
    pyproject = root / "pyproject.toml"
    text = pyproject.read_text(encoding="utf-8")
    for header, line in (
        (
            '[project.entry-points."vllm.general_plugins"]\n',
            'demo_carrier = "demo_carrier:register"',
        ),
        (
            '[project.entry-points."vllm_hust.extension_bundles"]\n',
            f'"{DEMO_ID}" = "demo_carrier.bundles.demo"',
        ),
    ):
        assert header in text
        text = text.replace(header, f"{header}{line}\n")
    text = text.replace('packages = ["src/', 'packages = ["src/demo_carrier", "src/', 1)
    pyproject.write_text(text, encoding="utf-8")


PROBE = """
import json, sys
from importlib.metadata import entry_points
sys.path.insert(0, sys.argv[1])
demo_id, demo_switch, spark_id, spark_switch, listing_env = sys.argv[2:]
from vllm_hust_bundle_kit import installed

toolkit_only = sorted(m.split(".")[0] for m in sys.modules if m.split(".")[0].endswith("carrier")
                      or m.startswith("vllm_spark2_5_plugin"))
bundles = installed.discover()
for bundle in bundles:
    installed.validate(bundle)
import demo_carrier, vllm_spark2_5_plugin
switches = {"demo": demo_carrier._switch(), "spark": vllm_spark2_5_plugin.carrier_switch()}
def decisions(env):
    return {name: switch.decide(env).enabled for name, switch in switches.items()}
plugins = sorted(ep.name for ep in entry_points(group="vllm.general_plugins"))
print(json.dumps({
    "toolkit_only": toolkit_only,
    "bundles": [b.extension_id for b in bundles],
    "carriers": sorted(t for b in bundles for t in b.carriers()),
    "plugins": plugins,
    "demo_on": decisions({demo_switch: "1"}),
    "spark_on": decisions({spark_switch: "1"}),
    "demo_listed": decisions({listing_env: demo_id}),
    "nothing": decisions({}),
}))
"""


@pytest.fixture(scope="module")
def scaffolded(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("two-carriers")
    copy_project(root)
    for name in ("README.md", "LICENSE", "NOTICE"):  # what the build needs besides the code
        (root / name).write_bytes((PROJECT_ROOT / name).read_bytes())
    add_demo_carrier(root)
    return root


def test_both_bundles_render_build_install_and_switch_on_only_themselves(scaffolded, tmp_path):
    tool = str(Path(sys.executable).with_name("vllm-hust-bundle"))
    rendered = run([tool, "render", "--root", str(scaffolded), "--json"])
    assert len(json.loads(rendered.stdout)) == 2
    run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path), str(scaffolded)])
    (wheel,) = tmp_path.glob("*.whl")
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "install"]
    run([*pip, "--no-deps", "--no-compile", "--target", str(site), str(wheel)])

    spark = carrier_switch()
    argv = [str(site), DEMO_ID, DEMO_SWITCH, spark.bundle_id, spark.enable_env]
    done = run([sys.executable, "-I", "-c", textwrap.dedent(PROBE), *argv, ENABLED_BUNDLES_ENVS[0]])
    report = json.loads(done.stdout)
    assert report["toolkit_only"] == []
    assert report["bundles"] == sorted([DEMO_ID, spark.bundle_id])
    assert "demo_carrier:register" in report["carriers"]
    assert {"demo_carrier", "spark2_5"} <= set(report["plugins"])
    assert report["demo_on"] == {"demo": True, "spark": False}
    assert report["spark_on"] == {"demo": False, "spark": True}
    assert report["demo_listed"] == {"demo": True, "spark": False}
    assert report["nothing"] == {"demo": False, "spark": False}
