"""What the carrier costs vLLM when it is installed: entry point and server start.

1. ``register()`` with the switch off, in fresh interpreters: import plus call
   time, and which heavy modules (``vllm``, ``torch``, ``transformers``) the
   entry point pulled in (it must pull in none). Once in a bare interpreter,
   where the import also loads ``logging``, and once with the standard-library
   modules it shares with every vLLM process already imported.
2. ``register()`` enabled and disabled in a process that has imported vLLM's
   config, model and tool-parser registries, as every ``vllm serve`` process
   has when it loads plugins: what enabling costs there, alternating.
3. vLLM's own plugin-loading step (``vllm.plugins.load_general_plugins``) in a
   process that has imported ``vllm`` only: carrier enabled, disabled, and
   excluded by ``VLLM_PLUGINS``; fresh interpreters, alternating.
4. ``vllm serve`` start-to-healthy on a tiny in-tree Llama with the carrier
   disabled, excluded by ``VLLM_PLUGINS``, and enabled, in rotation.

    python extensions/spark2_5/benchmarks/bench_carrier.py [--quick] [--out PATH.json]
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import Record, base_parser, spread, table

from carrier_harness.server import VllmServer
from spark2_5_dev.carrier import CARRIER_ENVS, ENABLE_ENV, clean_env
from spark2_5_dev.checkpoints import build_llama_checkpoint

HEAVY_MODULES = ("vllm", "torch", "transformers")
# vLLM's own general plugins: allowlisting exactly these excludes only the carrier.
OTHER_GENERAL_PLUGINS = "lora_filesystem_resolver,lora_hf_hub_resolver"

# Standard-library modules of the entry point that any vLLM process has loaded
# long before it loads plugins.
VLLM_PROCESS_STDLIB = "import dataclasses, importlib.util, json, logging"
# Runs in a fresh interpreter after PRELUDE; prints one JSON line last.
ENTRY_POINT_PROBE = f"""
import json, sys, time
PRELUDE
before = set(sys.modules)
started = time.perf_counter()
import vllm_spark2_5_plugin
imported = time.perf_counter()
vllm_spark2_5_plugin.register()
registered = time.perf_counter()
added = set(sys.modules) - before
print(json.dumps({{
    "import_ms": (imported - started) * 1e3,
    "register_ms": (registered - imported) * 1e3,
    "total_ms": (registered - started) * 1e3,
    "modules_added": len(added),
    "heavy_modules": sorted(m for m in {HEAVY_MODULES!r} if m in added),
}}))
"""
PLUGIN_LOADING_PROBE = """
import json, time
import vllm
import vllm.plugins
started = time.perf_counter()
vllm.plugins.load_general_plugins()
loaded = time.perf_counter()
print(json.dumps({"load_general_plugins_ms": (loaded - started) * 1e3}))
"""


def _probe_env(**switches: str) -> dict[str, str]:
    """A probe's environment: whatever the caller's says about the carrier, only the
    variant's ``switches``; vLLM on CPU, no usage stats."""
    return clean_env(VLLM_TARGET_DEVICE="cpu", VLLM_NO_USAGE_STATS="1", **switches)


def _probe(code: str, env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    if done.returncode != 0:
        raise RuntimeError(f"probe failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_entry_point(repeats: int) -> dict[str, Any]:
    print("\n== register() with the switch off, fresh interpreters", flush=True)
    return {
        "bare interpreter": _entry_point_runs(repeats, ""),
        "stdlib as in a vLLM process": _entry_point_runs(repeats, VLLM_PROCESS_STDLIB),
    }


def _entry_point_runs(repeats: int, prelude: str) -> dict[str, Any]:
    code = ENTRY_POINT_PROBE.replace("PRELUDE", prelude)
    runs = [_probe(code, _probe_env()) for _ in range(repeats)]
    heavy = sorted({m for run in runs for m in run["heavy_modules"]})
    for run in runs:
        print(
            f"  {prelude or 'bare'}: import {run['import_ms']:.3f} ms, "
            f"register {run['register_ms']:.3f} ms"
        )
    return {
        "import_ms": spread([r["import_ms"] for r in runs]),
        "register_ms": spread([r["register_ms"] for r in runs]),
        "total_ms": spread([r["total_ms"] for r in runs]),
        "modules_added": spread([r["modules_added"] for r in runs]),
        "heavy_modules_imported": heavy,
    }


# What every `vllm serve` process (API server, engine core, worker) has imported by
# the time it loads its general plugins (seen in vLLM 0.32's serve log).
SERVE_PROCESS_REGISTRIES = (
    "import vllm.model_executor.models.registry, vllm.transformers_utils.config, vllm.tool_parsers"
)


def run_register_in_a_serve_process(repeats: int) -> dict[str, Any]:
    print("\n== register() after vLLM's registries are imported, enabled vs disabled", flush=True)
    code = ENTRY_POINT_PROBE.replace("PRELUDE", SERVE_PROCESS_REGISTRIES)
    variants = {"enabled": _probe_env(**{ENABLE_ENV: "1"}), "disabled": _probe_env()}
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for index in range(repeats):
        for name in list(variants)[:: 1 if index % 2 == 0 else -1]:
            elapsed = _probe(code, variants[name])["total_ms"]
            samples[name].append(elapsed)
            print(f"  {name:9s} {elapsed:8.2f} ms", flush=True)
    summary = {name: spread(values) for name, values in samples.items()}
    return {
        "variants": summary,
        "enabled_minus_disabled_ms": summary["enabled"]["median"] - summary["disabled"]["median"],
    }


def run_plugin_loading(repeats: int) -> dict[str, Any]:
    print("\n== vllm.plugins.load_general_plugins() after `import vllm`", flush=True)
    variants = {
        "enabled": _probe_env(**{ENABLE_ENV: "1"}),
        "disabled": _probe_env(),
        "excluded by VLLM_PLUGINS": _probe_env(VLLM_PLUGINS=OTHER_GENERAL_PLUGINS),
    }
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for index in range(repeats):
        names = list(variants) if index % 2 == 0 else list(reversed(variants))
        for name in names:
            elapsed = _probe(PLUGIN_LOADING_PROBE, variants[name])["load_general_plugins_ms"]
            samples[name].append(elapsed)
            print(f"  {name:26s} {elapsed:8.2f} ms", flush=True)
    return {name: spread(values) for name, values in samples.items()}


def run_serve_start(repeats: int) -> dict[str, Any]:
    print("\n== vllm serve start-to-healthy (tiny in-tree Llama)", flush=True)
    variants = {
        "disabled": ({}, "enabled=0"),
        "excluded by VLLM_PLUGINS": ({"VLLM_PLUGINS": OTHER_GENERAL_PLUGINS}, None),
        "enabled": ({ENABLE_ENV: "1"}, "enabled=1"),
    }
    samples: dict[str, list[float]] = {name: [] for name in variants}
    # VllmServer starts from this process's environment: no carrier switch in it.
    for name in CARRIER_ENVS:
        os.environ.pop(name, None)
    with tempfile.TemporaryDirectory(prefix="bench-carrier-") as tmp:
        model = build_llama_checkpoint(Path(tmp) / "llama")
        names = list(variants)
        for index in range(repeats):
            for name in names[index % len(names) :] + names[: index % len(names)]:
                env, load_line = variants[name]
                server = VllmServer(model, env=env, log_path=Path(tmp) / f"serve-{index}.log")
                started = time.perf_counter()
                with server:
                    elapsed = time.perf_counter() - started
                log = server.log()
                carrier_logged = "vllm-spark2_5-plugin loaded" in log
                if carrier_logged != (load_line is not None) or (
                    load_line and load_line not in log
                ):
                    raise RuntimeError(f"{name}: the carrier's load line is not as expected")
                samples[name].append(elapsed)
                print(f"  {name:26s} {elapsed:6.2f} s to healthy", flush=True)
    summary = {name: spread(values) for name, values in samples.items()}
    excluded = summary["excluded by VLLM_PLUGINS"]["median"]
    noise = max(s["max"] - s["min"] for s in summary.values())
    return {
        "variants": summary,
        "median_minus_excluded_s": {
            name: s["median"] - excluded
            for name, s in summary.items()
            if name != "excluded by VLLM_PLUGINS"
        },
        "largest_spread_s": noise,
        "health_poll_interval_s": 0.5,
    }


def main() -> int:
    parser = base_parser(__doc__.split("\n\n")[0])
    args = parser.parse_args()
    repeats = (
        {"entry": 5, "in_serve_process": 5, "loading": 3, "serve": 2}
        if args.quick
        else {"entry": 15, "in_serve_process": 15, "loading": 7, "serve": 4}
    )
    record = Record("carrier", {"repeats": repeats, "excluded_with": OTHER_GENERAL_PLUGINS})
    results = record.data["results"]
    results["register_disabled"] = run_entry_point(repeats["entry"])
    results["register_in_a_serve_process"] = run_register_in_a_serve_process(
        repeats["in_serve_process"]
    )
    results["load_general_plugins"] = run_plugin_loading(repeats["loading"])
    results["serve_start"] = run_serve_start(repeats["serve"])
    print_report(results)
    record.finish(args.out)
    return 0


def print_report(results: dict[str, Any]) -> None:
    print("\nEntry point with the switch off (fresh interpreters, ms, median (min-max)):")
    rows = []
    for context, entry in results["register_disabled"].items():
        timings = [
            f"{entry[key]['median']:.3f} ({entry[key]['min']:.3f}-{entry[key]['max']:.3f})"
            for key in ("import_ms", "register_ms", "total_ms")
        ]
        rows.append((context, *timings, ", ".join(entry["heavy_modules_imported"]) or "none"))
    print(table(("context", "import", "register()", "total", "heavy modules imported"), rows))
    in_serve = results["register_in_a_serve_process"]
    print("\nregister() where vLLM's registries are already imported (fresh interpreters, ms):")
    print(
        table(
            ("carrier", "median", "min-max"),
            [
                (name, s["median"], f"{s['min']:.2f}-{s['max']:.2f}")
                for name, s in in_serve["variants"].items()
            ],
        )
    )
    print(f"enabled minus disabled: {in_serve['enabled_minus_disabled_ms']:.2f} ms")
    loading = results["load_general_plugins"]
    excluded = loading["excluded by VLLM_PLUGINS"]["median"]
    print("\nvLLM's load_general_plugins() after `import vllm` (median ms, vs excluded):")
    print(
        table(
            ("carrier", "median ms", "min-max", "minus excluded"),
            [
                (name, s["median"], f"{s['min']:.1f}-{s['max']:.1f}", s["median"] - excluded)
                for name, s in loading.items()
            ],
        )
    )
    serve = results["serve_start"]
    print("\nvllm serve start-to-healthy (s):")
    differences = serve["median_minus_excluded_s"]
    print(
        table(
            ("carrier", "median", "min-max", "minus excluded"),
            [
                (name, s["median"], f"{s['min']:.2f}-{s['max']:.2f}", differences.get(name, 0.0))
                for name, s in serve["variants"].items()
            ],
        )
    )
    print(f"largest spread of one variant: {serve['largest_spread_s']:.2f} s")


if __name__ == "__main__":
    sys.exit(main())
