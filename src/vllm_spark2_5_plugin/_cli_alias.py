"""``spark2-5-bundle``: the bundle tool's name before 0.2.0, deprecated.

Runs ``vllm-hust-bundle`` under the old name for one release, saying so once on
stderr; it goes in the next minor release.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from vllm_hust_bundle_kit import cli

OLD_NAME = "spark2-5-bundle"


def main(argv: Sequence[str] | None = None) -> int:
    print(
        f"{OLD_NAME}: deprecated, use {cli.PROG} (same commands); this name goes in the next "
        "minor release",
        file=sys.stderr,
    )
    return cli.main(argv, prog=OLD_NAME)


if __name__ == "__main__":
    sys.exit(main())
