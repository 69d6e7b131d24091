"""Redaction: what the ledger stores passes through here first, so tokens and passwords that
leak into a cause, a lock or a URL never reach the file."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

REDACTED = "[redacted]"
# Keys whose string values are secrets whatever they look like. Whole words only:
# "output_tokens" and "token_count_mismatches" are numbers, not credentials.
_SECRET_KEY = re.compile(
    r"(?i)(^|[_\-.])(token|secret|password|passwd|api[_-]?key|credentials?|auth|authorization"
    r"|cookie|private[_-]?key|hf[_-]?token)($|[_\-.])"
)
_SECRET_VALUES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.S),
     REDACTED),
    (re.compile(r"\bhf_[A-Za-z0-9]{16,}"), REDACTED),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"), REDACTED),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{20,}"), REDACTED),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), REDACTED),
    (re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}"), r"\1 " + REDACTED),
    # scheme://user:password@host -> keep the user, drop the password
    (re.compile(r"(://[^/\s:@]+):[^/\s@]+@"), r"\1:" + REDACTED + "@"),
    # NAME_TOKEN=value, password: value (values short enough to be counts are left alone)
    (re.compile(
        r"(?i)\b([A-Z0-9_]*(?:TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY)[A-Z0-9_]*)(\s*[=:]\s*)"
        r"(?!\[redacted\])[^\s,;'\"]{8,}"),
     r"\1\2" + REDACTED),
)


def redact_text(text: str) -> str:
    for pattern, replacement in _SECRET_VALUES:
        text = pattern.sub(replacement, text)
    return text


def redact(value: Any, key: str = "") -> Any:
    """A copy of a JSON-like value with secret-looking keys and strings blanked."""
    if isinstance(value, str):
        return REDACTED if value and _SECRET_KEY.search(key) else redact_text(value)
    if isinstance(value, Mapping):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v, key) for v in value]
    return value
