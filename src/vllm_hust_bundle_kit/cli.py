# SPDX-License-Identifier: Apache-2.0
"""vllm-hust-bundle: render, validate and inspect vLLM-HUST extension bundles.

render builds each bundle's JSON manifest from a source checkout's
manifest.toml (for release managers). validate, inspect and env work on the
installed distributions (for operators): inspect says what the extension
manager (vllm-hust-ext) would do with a bundle, env prints what it would
inject. The manager's state file is read, never written: enabling stays the
manager's job.

Exit status: 0 all good; 1 the command ran and found a problem (a stale or
invalid manifest, a launch the manager would refuse, for inspect a bundle its
state file does not enable); 2 it could not run as
asked (bad arguments, an unknown bundle id, an unreadable or malformed input).
Problems print one line on stderr: PROG: error: FILE: FIELD = VALUE: PROBLEM AND FIX.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from vllm_hust_bundle_kit import installed, manager_launch, manager_state, render
from vllm_hust_bundle_kit.contract import MANAGER_LAUNCH_ONLY_ENVS
from vllm_hust_bundle_kit.errors import BundleError, shown
from vllm_hust_bundle_kit.switch import switch_names
from vllm_hust_bundle_kit.versions import host_compatibility

PROG = "vllm-hust-bundle"
OK, FOUND_PROBLEM, CANNOT_RUN = 0, 1, 2


class Finding(Exception):
    """The command ran and found a problem: exit status 1, this message on stderr."""


class UsageError(Exception):
    """Bad arguments: exit status 2, this message on stderr (argparse's usage line left out)."""


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message}; see `{self.prog} --help`")


def _emit(args: argparse.Namespace, document: Any, lines: Sequence[str]) -> None:
    print(json.dumps(document, indent=2, sort_keys=True) if args.json else "\n".join(lines))


def _render(args: argparse.Namespace) -> int:
    rendered = render.render(Path(args.root))
    if args.check:
        stale = [str(item.path) for item in rendered if not item.is_current()]
        _emit(
            args,
            {
                "stale": stale,
                "current": [str(i.path) for i in rendered if str(i.path) not in stale],
            },
            [f"{'stale' if str(i.path) in stale else 'up to date'}: {i.path}" for i in rendered],
        )
        if stale:
            raise Finding(
                f"{', '.join(stale)}: stale; it differs from what manifest.toml renders, "
                f"run `{args.prog} render`"
            )
        return OK
    written = set(render.write(rendered))
    report = {str(item.path): "wrote" if item.path in written else "unchanged" for item in rendered}
    _emit(args, report, [f"{state}: {path}" for path, state in report.items()])
    return OK


def _validate(args: argparse.Namespace) -> int:
    report = []
    for bundle in installed.select(installed.discover(), args.extension_ids):
        try:
            installed.validate(bundle)
            problem = None
        except BundleError as exc:
            problem = str(exc)
        report.append(
            {
                "extension_id": bundle.extension_id,
                "manifest_path": str(bundle.manifest_path),
                "valid": problem is None,
                "problem": problem,
            }
        )
    _emit(
        args,
        report,
        [
            f"valid: {item['extension_id']} ({item['manifest_path']})"
            if item["valid"]
            else f"invalid: {item['problem']}"
            for item in report
        ],
    )
    invalid = [item["problem"] for item in report if not item["valid"]]
    if invalid:
        raise Finding("; ".join(invalid))
    return OK


def _inspect_one(
    bundle: installed.Bundle, state: manager_state.ManagerState, bundles: Sequence[installed.Bundle]
) -> dict[str, Any]:
    item: dict[str, Any] = {
        "extension_id": bundle.extension_id,
        "manifest_path": str(bundle.manifest_path),
        "distribution": f"{bundle.distribution.name} {bundle.distribution.version}",
    }
    try:
        installed.validate(bundle)
    except BundleError as exc:
        return {**item, "problem": str(exc)}
    installed_host = host_compatibility(bundle.manifest)
    # What the manager judges: the entry's configured host_version, where it sets one.
    compatibility = host_compatibility(bundle.manifest, state.configuration(bundle.extension_id))
    launch = manager_launch.predict_launch(bundle, state, bundles)
    injected = launch.environment
    return {
        **item,
        "problem": None,
        "extension_version": bundle.manifest["extension_version"],
        "carriers": bundle.carriers(),
        "activation_blocker": installed.activation_blocker(bundle.manifest),
        "host": {
            "name": compatibility.host_name,
            "installed": installed_host.host_version,
            "configured_version": compatibility.host_version if compatibility.configured else None,
            "version_range": compatibility.version_range,
            "compatibility": compatibility.state,
            "note": compatibility.prerelease_note(),
        },
        "manager_state": {
            "path": str(state.path),
            "enabled": launch.enabled,
            "problem": state.problem,
        },
        "launch_refusal": launch.refusal,
        "launch_refusal_once_enabled": launch.refusal_once_enabled,
        "launch_environment": injected,
        "launch_also_sets": list(MANAGER_LAUNCH_ONLY_ENVS),
        "launch_overrides": manager_launch.overridden_by_launch(injected or {})
        if launch.enabled
        else {},
        "switch_off_for_one_launch": _switch_off_command(bundle),
    }


def _switch_off_command(bundle: installed.Bundle) -> str | None:
    """How to launch once without ``bundle`` while the manager keeps it enabled: its switch
    set after ``--``, where the manager's own value of it no longer applies."""
    switches = switch_names(bundle.manifest)
    if not switches:
        return None
    return f"vllm-hust-ext run -- env {' '.join(f'{n}=0' for n in switches)} COMMAND..."


def _launch_problem(item: dict[str, Any]) -> str | None:
    """Why the manager would not launch with ``item``'s bundle, naming file, field and value."""
    if item["problem"]:
        return item["problem"]
    if item["launch_refusal"]:
        return item["launch_refusal"]
    if not item["manager_state"]["enabled"]:
        fix = (
            f"and enabling it would not help: {item['launch_refusal_once_enabled']}"
            if item["launch_refusal_once_enabled"]
            else f"enable it with `vllm-hust-ext extension enable {item['extension_id']}`"
        )
        return (
            f"{item['manager_state']['path']}: extensions.{item['extension_id']}.enabled is not "
            f"true, so vllm-hust-ext run leaves this bundle out; {fix}"
        )
    return None


def _launch_lines(item: dict[str, Any]) -> list[str]:
    if item["launch_refusal"]:
        return [f"  launch: refused: {item['launch_refusal']}"]
    injected = " ".join(f"{k}={shlex.quote(v)}" for k, v in item["launch_environment"].items())
    if not item["manager_state"]["enabled"]:
        blocked = item["launch_refusal_once_enabled"]
        return [
            f"  launch: not enabled: vllm-hust-ext run leaves it out and injects {injected}",
            *([f"  once enabled: refused: {blocked}"] if blocked else []),
        ]
    overrides = item["launch_overrides"]
    return [
        f"  launch: vllm-hust-ext run would inject {injected}",
        f"  and, at launch only: {', '.join(item['launch_also_sets'])}",
        *(
            f"  note: your {name}={shlex.quote(value)} does not reach the command: the manager "
            f"sets {name}={shlex.quote(item['launch_environment'][name])}"
            for name, value in overrides.items()
        ),
        *(
            [f"  one launch without it: {item['switch_off_for_one_launch']}"]
            if item["switch_off_for_one_launch"]
            else []
        ),
    ]


def _inspect_lines(item: dict[str, Any]) -> list[str]:
    if item["problem"] and "carriers" not in item:
        return [f"{item['extension_id']}: invalid: {item['problem']}"]
    host, state = item["host"], item["manager_state"]
    configured = (
        f" (judged: the configured host_version {shown(host['configured_version'])})"
        if host["configured_version"] is not None
        else ""
    )
    return [
        f"{item['extension_id']} {item['extension_version']} ({item['distribution']})",
        f"  manifest: {item['manifest_path']}",
        *(f"  carrier: {target} ({status})" for target, status in item["carriers"].items()),
        f"  host: {host['name']} {host['installed'] or '(not installed)'}, range "
        f"{host['version_range']}: {host['compatibility']}{configured}",
        *([f"  note: {host['note']}"] if host["note"] else []),
        f"  manager state {state['path']}: {'enabled' if state['enabled'] else 'not enabled'}",
        *_launch_lines(item),
    ]


def _inspect(args: argparse.Namespace) -> int:
    bundles = installed.discover()
    selected = installed.select(bundles, args.extension_ids)
    state = manager_state.read_state(manager_state.state_path(), bundles)
    report = [_inspect_one(bundle, state, bundles) for bundle in selected]
    _emit(args, report, [line for item in report for line in _inspect_lines(item)])
    problems = list(dict.fromkeys(p for p in map(_launch_problem, report) if p))
    if problems:
        raise Finding("; ".join(problems))
    return OK


def _env(args: argparse.Namespace) -> int:
    bundles = installed.discover()
    selected = installed.select(bundles, args.extension_ids)
    for bundle in selected:
        installed.validate(bundle)
    # The manager refuses every launch while its state file is unusable or stale, or an
    # enabled entry's configuration is refused; the bundles' own entries configure them.
    state = manager_state.read_state(manager_state.state_path(), bundles)
    if state.problem:
        raise Finding(state.problem)
    try:
        environment = manager_launch.activation_environment(selected, state=state)
    except BundleError as exc:
        raise Finding(str(exc)) from None
    evidence = manager_launch.evidence_refusal()
    if evidence:
        raise Finding(evidence)
    _emit(
        args,
        environment,
        [f"export {name}={shlex.quote(value)}" for name, value in sorted(environment.items())],
    )
    return OK


def _version() -> str:
    """The distribution that installs this command (found by its console script)."""
    owners = sorted(
        {
            f"{dist.metadata['Name']} {dist.version}"
            for dist in importlib.metadata.distributions()
            if any(ep.value.startswith(f"{__package__}.cli:") for ep in dist.entry_points)
        }
    )
    return f"%(prog)s, from {', '.join(owners) or 'a source tree'}"


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=prog,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=_version())
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    json_help = "print JSON instead of text"
    ids_help = "bundle ids (default: every installed bundle)"

    def command(name: str, help_text: str, handler: Callable[..., int]) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("--json", action="store_true", help=json_help)
        sub.set_defaults(handler=handler)
        return sub

    sub = command("render", "validate manifest.toml and write each bundle's JSON manifest", _render)
    sub.add_argument("--root", default=".", help="project root holding manifest.toml")
    sub.add_argument("--check", action="store_true", help="write nothing; exit 1 if one is stale")
    sub = command("validate", "check installed bundles' manifests", _validate)
    sub.add_argument("extension_ids", nargs="*", metavar="BUNDLE_ID", help=ids_help)
    sub = command(
        "inspect",
        "show installed bundles as the extension manager sees them: carriers, host "
        "compatibility, state, and what a launch would inject or why it would be refused",
        _inspect,
    )
    sub.add_argument("extension_ids", nargs="*", metavar="BUNDLE_ID", help=ids_help)
    sub = command(
        "env",
        "print the variables a manager launch with these bundles enabled injects, to "
        "export them by hand where the manager is not installed",
        _env,
    )
    sub.add_argument("extension_ids", nargs="+", metavar="BUNDLE_ID", help="bundle ids")
    return parser


def main(argv: Sequence[str] | None = None, prog: str = PROG, notice: str = "") -> int:
    """Run one command. ``notice`` ends the error line, or is a line of its own on stderr
    when all went well, so that each outcome stays one line on stderr."""
    try:
        args = _parser(prog).parse_args(argv)
        args.prog = prog
        status = args.handler(args)
    except (Finding, BundleError, UsageError) as exc:
        text = " ".join(str(exc).splitlines())  # one line, whatever a value held
        print(f"{prog}: error: {text}{f' ({notice})' if notice else ''}", file=sys.stderr)
        return FOUND_PROBLEM if isinstance(exc, Finding) else CANNOT_RUN
    except BrokenPipeError:  # the reader (e.g. `| head`) stopped reading: not an error
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keeps the interpreter's flush quiet
        return OK
    if notice:
        print(notice, file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
