"""`--progress/--no-progress`: one option, one default, for gate, deploy (one host or --fleet) and demo."""

from __future__ import annotations

import sys
from typing import Any

import click


def progress_option(f: Any) -> Any:
    return click.option(
        "--progress/--no-progress", "show_progress", default=None,
        help="A live view on the terminal (default: when stderr is one); --no-progress: plain lines.")(f)


def wants_live(flag: bool | None) -> bool:
    """The live view when asked, else when stderr is a terminal (CI, pipes and tests get plain lines)."""
    return sys.stderr.isatty() if flag is None else flag
