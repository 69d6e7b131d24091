"""Output paths are checked before anything else happens: a bad --json after a deploy is too late."""

from __future__ import annotations

from pathlib import Path

from stackbuild.errors import InputError


def check_writable(path: Path, flag: str) -> None:
    """Open `path` for appending (creating nothing that stays) or raise a one-line InputError."""
    if path.is_dir():
        raise InputError(f"{flag} {path}: is a directory; pass a file path")
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8"):
            pass
    except OSError as err:
        raise InputError(f"{flag} {path}: cannot write here ({err.strerror}); pass a writable path") from err
    if not existed:
        path.unlink(missing_ok=True)

