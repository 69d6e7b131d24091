"""Push retries against a registry that fails: a loopback proxy in front of the real registry.

The proxy forwards every request to the test registry and answers the first
manifest PUT(s) itself with the status a test asks for, the way a registry behind
a load balancer fails: 503 is transient (our tenacity policy pushes again, the
layers are already there, the manifest lands), 403 is not (one attempt, a clear
error). dockerd retries layer uploads on its own, so only the manifest PUT, which
it does not retry, shows our policy.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import ClientSession, web

from stackbuild.image import engine
from stackbuild.image.registry import manifest_digest, parse_ref

pytestmark = pytest.mark.integration

_HOP = {"host", "content-length", "transfer-encoding", "connection"}


@dataclass
class FlakyRegistry:
    upstream: str
    fail_status: int = 503
    fail_times: int = 0
    manifest_puts: list[int] = field(default_factory=list)
    port: int = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.method == "PUT" and "/manifests/" in request.path:
            if len(self.manifest_puts) < self.fail_times:
                self.manifest_puts.append(self.fail_status)
                return web.json_response(
                    {"errors": [{"code": "UNAVAILABLE", "message": "injected by the test proxy"}]},
                    status=self.fail_status)
            self.manifest_puts.append(200)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        # keep the client's Host so the registry's Location headers point back at this proxy
        headers["Host"] = request.headers["Host"]
        async with ClientSession(auto_decompress=False) as s, s.request(
                request.method, f"http://{self.upstream}{request.rel_url}", headers=headers, data=body,
                allow_redirects=False) as up:
            data = await up.read()
            out = {k: v for k, v in up.headers.items() if k.lower() not in _HOP}
            if request.method == "HEAD" and "Content-Length" in up.headers:
                # a HEAD answers the blob's size; dockerd refuses a blob check without it
                out["Content-Length"] = up.headers["Content-Length"]
                return web.Response(status=up.status, headers=out)
            return web.Response(status=up.status, body=data, headers=out)


@pytest.fixture
def flaky(registry: str) -> Iterator[FlakyRegistry]:
    proxy = FlakyRegistry(upstream=registry)
    loop = asyncio.new_event_loop()
    app = web.Application(client_max_size=2**31)
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    proxy.port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def _push(c: Any, base_image: str, proxy: FlakyRegistry, tag: str, attempts: int) -> str:
    """engine.push of the base image through the proxy; the proxy's tag is removed after."""
    ref = f"127.0.0.1:{proxy.port}/stackbuild-pushtest/base:{tag}"
    c.images.get(base_image).tag(ref)
    try:
        return engine.push(c, ref, attempts=attempts)
    finally:
        engine.untag(c, ref)


def test_transient_503_is_retried_until_the_manifest_lands(
        docker_client: Any, base_image: str, registry: str, flaky: FlakyRegistry) -> None:
    flaky.fail_times = 2
    digest = _push(docker_client, base_image, flaky, "retry", attempts=4)
    assert flaky.manifest_puts == [503, 503, 200]
    # the manifest is really in the registry behind the proxy, under the digest push reported
    assert manifest_digest(parse_ref(f"{registry}/stackbuild-pushtest/base:retry")) == digest


def test_permanent_403_fails_at_once_with_the_registry_message(
        docker_client: Any, base_image: str, flaky: FlakyRegistry) -> None:
    flaky.fail_status, flaky.fail_times = 403, 10
    with pytest.raises(engine.PushError) as info:
        _push(docker_client, base_image, flaky, "denied", attempts=4)
    assert flaky.manifest_puts == [403]
    assert not info.value.transient
    assert str(info.value).startswith(f"push of 127.0.0.1:{flaky.port}/stackbuild-pushtest/base:denied failed: ")


def test_transient_errors_give_up_after_the_attempts(
        docker_client: Any, base_image: str, flaky: FlakyRegistry) -> None:
    flaky.fail_times = 10
    with pytest.raises(engine.PushError) as info:
        _push(docker_client, base_image, flaky, "gaveup", attempts=3)
    assert flaky.manifest_puts == [503, 503, 503]
    assert info.value.transient
