"""Plain HTTP for tests that talk to a server the way any client would: JSON in, bytes out, SSE events."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def http(url: str, body: Any = None, method: str | None = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def sse(raw: bytes) -> list[Any]:
    events = [e[6:] for e in raw.decode().split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]
