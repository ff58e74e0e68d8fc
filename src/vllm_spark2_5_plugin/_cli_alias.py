# SPDX-License-Identifier: Apache-2.0
"""``spark2-5-bundle``: the bundle tool's name before 0.2.0, deprecated.

Runs ``vllm-hust-bundle`` under the old name for one release, saying so on
stderr: at the end of the error line when there is one, else on a line of its
own. It goes in the next minor release.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from vllm_hust_bundle_kit import cli

OLD_NAME = "spark2-5-bundle"


def main(argv: Sequence[str] | None = None) -> int:
    notice = (
        f"{OLD_NAME} is deprecated, use {cli.PROG} (same commands); this name goes in the "
        "next minor release"
    )
    return cli.main(argv, prog=OLD_NAME, notice=notice)


if __name__ == "__main__":
    sys.exit(main())
