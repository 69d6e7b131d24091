"""The step log: every step of a deploy or a rollout, as it happened, in a file next to the ledger.

Why next to the ledger (`<ledger dir>/logs/`, `.stackbuild/logs/` by default) and not in the
cache: the log is the detail of the deploy or rollout row the ledger records, a record like
the report written beside it, while the cache holds what can be fetched again and may be wiped.
It also follows `--ledger`, so a test that points the ledger at its temp dir keeps its logs there.

Nothing secret reaches the file: each line passes the ledger's redaction (redact.py) and the
values of the secrets handed to the run are blanked by value, whatever they look like.
"""

from __future__ import annotations

import contextlib
import re
import secrets as _secrets
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

from stackbuild.errors import InputError
from stackbuild.results.redact import REDACTED, redact_text

# A secret value shorter than this is blanked only by the pattern redaction: blanking every "abc"
# in the log would garble it, and a credential is never that short.
MIN_SECRET_LEN = 4


def _utc_now() -> datetime:
    return datetime.now(UTC)


def log_path(ledger: Path, kind: str, name: str) -> Path:
    """`<ledger dir>/logs/<kind>-<name>.log`, the name reduced to characters safe in a file name."""
    return ledger.parent / "logs" / f"{kind}-{re.sub(r'[^A-Za-z0-9._-]+', '_', name)}.log"


def deploy_log_path(ledger: Path, label: str, now: Callable[[], datetime] = _utc_now) -> Path:
    """A single deploy's own log: when it started, what it deploys, and a random tail (two deploys
    of the same stack from one project in the same second get two files)."""
    return log_path(ledger, "deploy", f"{now():%Y%m%dT%H%M%SZ}-{label}-{_secrets.token_hex(2)}")


class StepLog:
    """Append-only, line-buffered, one timestamped line per event line. `open()` before the host is
    touched: a log that cannot be written is refused then, like the ledger (results/recorder.py)."""

    def __init__(self, path: Path, secrets: Iterable[str] = (), now: Callable[[], datetime] = _utc_now) -> None:
        self.path = path
        self._secrets = sorted({s for s in secrets if len(s) >= MIN_SECRET_LEN}, key=len, reverse=True)
        self._now = now
        self._file: IO[str] | None = None

    def open(self) -> StepLog:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8", buffering=1)
        except OSError as err:
            raise InputError(f"{self.path}: cannot write the step log here ({err.strerror}); pass --ledger "
                             "with a writable path (the log goes in logs/ beside it)") from None
        return self

    def clean(self, text: str) -> str:
        for value in self._secrets:
            text = text.replace(value, REDACTED)
        return redact_text(text)

    def write(self, text: str, host: str = "") -> None:
        """Each line of `text`, stamped with the time (UTC, ms) and the host it is about."""
        if self._file is None:
            return
        stamp = self._now().strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        who = f" [{host}]" if host else ""
        try:
            for line in self.clean(text).splitlines() or [""]:
                self._file.write(f"{stamp}{who} {line}".rstrip() + "\n")
        except OSError:
            # the disk filled up mid-run: the deploy's outcome matters more than its log
            self.close()

    def __enter__(self) -> StepLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
