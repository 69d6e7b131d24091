"""Readiness in layers: the port opens, /health answers 200, one real generation works.

`wait_ready` polls until all three hold or the deadline passes, then raises an
InfraError naming the layer that was still failing (and what it last saw).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from stackbuild.errors import InfraError

LAYERS = ("port", "health", "generate")
POLL_S = 0.2


@dataclass(frozen=True)
class Readiness:
    url: str
    seconds: float
    # layer -> seconds from the start until it first held
    layers: dict[str, float] = field(default_factory=dict)
    text: str = ""


def host_port(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InfraError(f"{url}: not an http URL; use http://HOST:PORT")
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


async def port_open(url: str, timeout: float = 1.0) -> bool:
    host, port = host_port(url)
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def get_json(url: str, path: str, timeout: float = 10.0) -> Any:
    async with aiohttp.ClientSession() as s, s.get(
        url + path, timeout=aiohttp.ClientTimeout(total=timeout)
    ) as r:
        if r.status != 200:
            raise InfraError(f"GET {url}{path}: HTTP {r.status}")
        return await r.json(content_type=None)


async def complete(
    url: str, prompt: str, max_tokens: int, *, model: str = "default", timeout: float = 60.0
) -> str:
    """One greedy, non-streamed /v1/completions call; the text, or InfraError."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
    try:
        async with aiohttp.ClientSession() as s, s.post(
            url + "/v1/completions", json=body, timeout=aiohttp.ClientTimeout(total=timeout)
        ) as r:
            data = await r.json(content_type=None)
            if r.status != 200:
                raise InfraError(f"POST {url}/v1/completions: HTTP {r.status}: {str(data)[:200]}")
    except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as err:
        raise InfraError(f"POST {url}/v1/completions failed: {type(err).__name__}: {err}") from None
    try:
        return str(data["choices"][0]["text"])
    except (KeyError, IndexError, TypeError):
        raise InfraError(f"POST {url}/v1/completions: unexpected answer {str(data)[:200]}") from None


async def generate_once_async(url: str, *, timeout: float = 60.0) -> str:
    text = await complete(url, "Say hello.", 8, timeout=timeout)
    if not text.strip():
        raise InfraError(f"{url}: a real generation returned empty text")
    return text


def generate_once(url: str, *, timeout: float = 60.0) -> str:
    """One real generation (8 tokens, greedy); its text, or InfraError."""
    return asyncio.run(generate_once_async(url, timeout=timeout))


async def _health_status(url: str) -> int | str:
    try:
        async with aiohttp.ClientSession() as s, s.get(
            url + "/health", timeout=aiohttp.ClientTimeout(total=5)
        ) as r:
            return r.status
    except (aiohttp.ClientError, OSError, TimeoutError) as err:
        return type(err).__name__


async def wait_ready_async(url: str, deadline_s: float) -> Readiness:
    url = url.rstrip("/")
    host_port(url)
    t0 = time.monotonic()
    layers: dict[str, float] = {}
    last = {"port": "connection refused", "health": "not tried", "generate": "not tried"}
    while True:
        elapsed = time.monotonic() - t0
        if "port" not in layers and await port_open(url):
            layers["port"] = time.monotonic() - t0
        if "port" in layers and "health" not in layers:
            status = await _health_status(url)
            last["health"] = f"/health answered {status}"
            if status == 200:
                layers["health"] = time.monotonic() - t0
        if "health" in layers:
            try:
                text = await generate_once_async(url, timeout=max(deadline_s - elapsed, 5.0))
                layers["generate"] = time.monotonic() - t0
                return Readiness(url, layers["generate"], layers, text)
            except InfraError as err:
                last["generate"] = str(err)
        if time.monotonic() - t0 >= deadline_s:
            layer = next(lay for lay in LAYERS if lay not in layers)
            raise InfraError(
                f"{url} not ready after {deadline_s:g}s: layer '{layer}' failing "
                f"({last[layer]}); check the server's log"
            )
        await asyncio.sleep(POLL_S)


def wait_ready(url: str, deadline_s: float) -> Readiness:
    """Block until url serves (port, /health 200, one generation) or raise InfraError."""
    return asyncio.run(wait_ready_async(url, deadline_s))
