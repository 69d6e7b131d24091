"""The one owner of control-plane HTTP: single requests to a server, a registry or an index.

Blocking and small (urllib): health checks, one generation, a registry's API, a
JSON document. The gate's concurrent streaming load is the other kind of HTTP
and lives with the gate (aiohttp, gate/loadgen.py), which needs an event loop.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from stackbuild.errors import InfraError


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    headers: dict[str, str]  # names lower-cased

    def json(self) -> Any:
        return json.loads(self.body.decode("utf-8", errors="replace"))


class HttpFailure(InfraError):
    """What an HTTP call can fail with. Callers that tolerate failures catch this, never the
    broader InfraError: a deploy's SIGTERM arrives as an InfraError too and must get through."""


class BadAnswer(HttpFailure):
    """An answer, but not the one asked for (a status or a body)."""


class NoAnswer(HttpFailure):
    """Nothing answered at all (refused, reset, timed out): not an HTTP status."""

    def __init__(self, method: str, url: str, reason: str) -> None:
        super().__init__(f"{method} {url}: no answer ({reason})")
        self.reason = reason


def host_port(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InfraError(f"{url}: not an http URL; use http://HOST:PORT")
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


def port_open(url: str, timeout: float = 1.0) -> bool:
    """A TCP connection to the URL's host and port succeeds."""
    try:
        with socket.create_connection(host_port(url), timeout=timeout):
            return True
    except OSError:
        return False


def request(
    method: str,
    url: str,
    *,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 10.0,
) -> Reply:
    """Any answer, error statuses included, as a Reply; no answer at all is an InfraError."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return Reply(int(resp.status), resp.read(), _lower(resp.headers.items()))
    except urllib.error.HTTPError as err:
        return Reply(int(err.code), err.read() or b"", _lower(err.headers.items()) if err.headers else {})
    except (OSError, ValueError) as err:  # refused, reset, timed out, bad URL
        raise NoAnswer(method, url, str(getattr(err, "reason", err))) from None


def download(url: str, write: Callable[[bytes], object], *, timeout: float = 120.0,
             chunk: int = 1 << 20) -> None:
    """Stream a 200 answer's body to `write`, a chunk at a time (an index's wheel: too big to hold);
    any other status is a BadAnswer, nothing at all a NoAnswer."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url), timeout=timeout) as resp:
            for part in iter(lambda: resp.read(chunk), b""):
                write(part)
    except urllib.error.HTTPError as err:
        raise BadAnswer(f"GET {url}: HTTP {err.code}") from None
    except (OSError, ValueError) as err:  # refused, reset, timed out, bad URL
        raise NoAnswer("GET", url, str(getattr(err, "reason", err))) from None


def _lower(items: Iterable[tuple[str, str]]) -> dict[str, str]:
    return {k.lower(): v for k, v in items}


def get(url: str, *, timeout: float = 10.0, headers: dict[str, str] | None = None) -> Reply:
    return request("GET", url, timeout=timeout, headers=headers)


def post_json(url: str, doc: Any, *, timeout: float = 60.0) -> Reply:
    return request("POST", url, body=json.dumps(doc).encode(), headers={"Content-Type": "application/json"},
                   timeout=timeout)


def status(url: str, *, timeout: float = 3.0) -> int | None:
    """The HTTP status of a GET, or None when nothing answered."""
    try:
        return get(url, timeout=timeout).status
    except NoAnswer:
        return None


def completion_request(prompt: str, max_tokens: int, model: str = "default") -> dict[str, Any]:
    """The body of one greedy, non-streamed OpenAI /v1/completions call."""
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}


def completion_text(url: str, status: int, body: bytes) -> str:
    """The text of a /v1/completions answer, or BadAnswer saying what came instead."""
    if status != 200:
        raise BadAnswer(f"POST {url}/v1/completions: HTTP {status}: {body[:200]!r}")
    try:
        return str(json.loads(body.decode("utf-8", errors="replace"))["choices"][0]["text"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise BadAnswer(f"POST {url}/v1/completions: unexpected answer {body[:200]!r}") from None


def complete(url: str, prompt: str, max_tokens: int, *, model: str = "default", timeout: float = 60.0) -> str:
    """One greedy, non-streamed /v1/completions call; its text, or an HttpFailure."""
    url = url.rstrip("/")
    reply = post_json(url + "/v1/completions", completion_request(prompt, max_tokens, model), timeout=timeout)
    return completion_text(url, reply.status, reply.body)
