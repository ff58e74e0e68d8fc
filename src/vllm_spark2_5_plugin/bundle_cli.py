"""``spark2-5-bundle``: render, validate and inspect extension bundles; show what enabling injects.

For release managers (``render`` from a source checkout) and operators (the
other commands work on the installed distributions). Errors print one line,
``spark2-5-bundle: error: <file>: <field> = <value>: <problem and fix>``, and
exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from vllm_spark2_5_plugin import bundle
from vllm_spark2_5_plugin.bundle import BundleError

PROG = "spark2-5-bundle"


def _render(args: argparse.Namespace) -> int:
    rendered = bundle.render(Path(args.root))
    if args.check:
        stale = [str(item.path) for item in rendered if not item.is_current()]
        if stale:
            raise BundleError(
                f"{', '.join(stale)}: stale; it differs from what manifest.toml renders, "
                f"run `{PROG} render`"
            )
        print(f"up to date: {', '.join(str(item.path) for item in rendered)}")
        return 0
    written = set(bundle.write(rendered))
    for item in rendered:
        print(f"{'wrote' if item.path in written else 'unchanged'}: {item.path}")
    return 0


def _validate(args: argparse.Namespace) -> int:
    for extension in bundle.select(bundle.discover(), args.extension_ids):
        bundle.validate(extension)
        print(
            f"valid: {extension.extension_id} {extension.manifest['extension_version']} "
            f"({extension.manifest_path})"
        )
    return 0


def _inspect(args: argparse.Namespace) -> int:
    enabled = set(bundle.enabled_ids(bundle.read_state(bundle.state_path())))
    report = []
    for extension in bundle.select(bundle.discover(), args.extension_ids):
        try:
            bundle.validate(extension)
        except BundleError as exc:
            report.append({"extension_id": extension.extension_id, "problem": str(exc)})
            continue
        compatibility = bundle.host_compatibility(extension.manifest)
        report.append(
            {
                "extension_id": extension.extension_id,
                "extension_version": extension.manifest["extension_version"],
                "distribution": f"{extension.distribution.name} {extension.distribution.version}",
                "manifest_path": str(extension.manifest_path),
                "enabled": extension.extension_id in enabled,
                "carriers": {
                    f"{item['module']}:{item['object']}": item["status"]
                    for item in extension.manifest["implementation"]
                    if item["type"] == "python_module"
                },
                "activation_blocker": bundle.activation_blocker(extension.manifest),
                "host": {
                    "name": compatibility.host_name,
                    "installed": compatibility.host_version,
                    "version_range": compatibility.version_range,
                    "compatibility": compatibility.state,
                },
                "launch_refusal": bundle.launch_refusal(extension),
            }
        )
    print(json.dumps(report, indent=2))
    return 0


def _env(args: argparse.Namespace) -> int:
    installed = bundle.discover()
    extension_ids = args.extension_ids or bundle.enabled_ids(bundle.read_state(bundle.state_path()))
    selected = bundle.select(installed, extension_ids) if extension_ids else []
    for extension in selected:
        bundle.validate(extension)
    environment = bundle.activation_environment(selected)
    if args.json:
        print(json.dumps(environment, indent=2, sort_keys=True))
    else:
        for name, value in sorted(environment.items()):
            print(f"export {name}={shlex.quote(value)}")
    return 0


def _set_enabled(args: argparse.Namespace) -> int:
    (extension,) = bundle.select(bundle.discover(), [args.extension_id])
    bundle.validate(extension)
    path = bundle.state_path()
    bundle.set_enabled(path, extension, args.enable)
    print(f"{'enabled' if args.enable else 'disabled'} {extension.extension_id} (state: {path})")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    render = commands.add_parser(
        "render", help="validate manifest.toml and write each bundle's JSON manifest"
    )
    render.add_argument("--root", default=".", help="project root holding manifest.toml")
    render.add_argument(
        "--check", action="store_true", help="write nothing; fail if a rendered file is stale"
    )
    render.set_defaults(handler=_render)

    ids_help = "extension ids (default: every installed bundle)"
    validate = commands.add_parser("validate", help="check installed bundles' manifests")
    validate.add_argument("extension_ids", nargs="*", metavar="EXTENSION_ID", help=ids_help)
    validate.set_defaults(handler=_validate)

    inspect = commands.add_parser(
        "inspect", help="show installed bundles, carrier status and host compatibility (JSON)"
    )
    inspect.add_argument("extension_ids", nargs="*", metavar="EXTENSION_ID", help=ids_help)
    inspect.set_defaults(handler=_inspect)

    env = commands.add_parser(
        "env", help="print the environment enabling these bundles injects into a vLLM launch"
    )
    env.add_argument(
        "extension_ids",
        nargs="*",
        metavar="EXTENSION_ID",
        help="extension ids (default: those enabled in the state file)",
    )
    env.add_argument("--json", action="store_true", help="print a JSON object")
    env.set_defaults(handler=_env)

    for name, enable in (("enable", True), ("disable", False)):
        command = commands.add_parser(
            name,
            help=f"record in the state file (${bundle.STATE_ENV} or {bundle.DEFAULT_STATE_PATH}) "
            f"that a bundle is {name}d",
        )
        command.add_argument("extension_id", metavar="EXTENSION_ID")
        command.set_defaults(handler=_set_enabled, enable=enable)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.handler(args)
    except BundleError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
