"""Fail fast on a stall (issue 23): when the profile allows no failed request, the first request
past its stall bound decides the level, and the rest of its run is cancelled.

Against an in-process streaming server on 127.0.0.1 whose first request sends one chunk and then
nothing, while every other request streams its tokens 20 ms apart: the outcome does not depend on
timing luck (400 requests take seconds; the stall bound is a fraction of that).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from stackbuild.gate import loadgen, runner
from stackbuild.spec.profile import GateProfile, Workload

WL = Workload(input_len=4, output_len=4, stall_timeout_s=0.5, timeout_s=30.0, warmup=0, concurrency=(4,))


@dataclass
class Server:
    stalls: int  # the first this many requests stall after one chunk
    slow: int = 0  # the next this many take 30 s (a chunk each `every` s): in flight when the stall is decided
    every: float = 0.25
    seen: int = 0
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        n, self.seen = self.seen, self.seen + 1
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chunk = b"data: " + json.dumps({"choices": [{"text": "a"}]}).encode() + b"\n\n"
        try:
            await resp.write(chunk)
            if n < self.stalls:
                await self.release.wait()  # stalled: the client's stall bound ends it
                return resp
            slow = n < self.stalls + self.slow
            for _ in range(round(30 / self.every) if slow else WL.output_len - 1):
                await asyncio.sleep(self.every if slow else 0.02)
                await resp.write(chunk)
            usage = {"choices": [], "usage": {"completion_tokens": WL.output_len, "prompt_tokens": WL.input_len}}
            await resp.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
        except (ConnectionError, RuntimeError):
            pass  # the client went away (cancelled): nothing to answer
        return resp


@asynccontextmanager
async def serving(stalls: int, slow: int = 0, every: float = 0.25) -> AsyncIterator[tuple[str, Server]]:
    srv = Server(stalls, slow, every)
    app = web.Application()
    app.router.add_post("/v1/completions", srv.completions)
    run = web.AppRunner(app, shutdown_timeout=0.5)
    await run.setup()
    site = web.TCPSite(run, "127.0.0.1", 0)
    await site.start()
    port = run.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", srv
    finally:
        srv.release.set()
        await run.cleanup()


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_the_first_stalled_request_ends_the_run_when_none_may_fail() -> None:
    # The server shares the client's event loop: a loop held up past the stall bound (a loaded CI
    # machine held it 0.5 s) silenced the slow requests too, and all four were recorded stalled. A
    # chunk each 0.05 s against a 2 s bound leaves 1.95 s of such a pause before that happens.
    wl = WL.model_copy(update={"stall_timeout_s": 2.0})

    async def go() -> tuple[list[loadgen.RequestRecord], float, int]:
        # the other 3 workers' first requests take 30 s: certainly in flight at the 2 s stall bound
        async with serving(stalls=1, slow=3, every=0.05) as (url, srv):
            prompts = [[1000 + i] * wl.input_len for i in range(400)]
            t0 = time.monotonic()
            records, _ = await loadgen.run_requests(url, wl, 4, prompts, fail_after=0)
            return records, time.monotonic() - t0, srv.seen

    records, took, sent = _run(go())
    # decided at the stall bound: the other workers' requests in flight were cancelled, unrecorded
    # (they would have ended after 30 s; half that is a bound no loaded machine reaches), and
    # nothing more was sent
    assert [r.error for r in records] == ["stalled: no byte for 2s"]
    assert sent == 4 and took < 15


def test_failures_within_the_allowance_do_not_end_the_run() -> None:
    async def go() -> list[loadgen.RequestRecord]:
        async with serving(stalls=2) as (url, _srv):
            prompts = [[1000 + i] * WL.input_len for i in range(12)]
            records, _ = await loadgen.run_requests(url, WL, 4, prompts, fail_after=2)
            return records

    records = _run(go())
    assert (len(records), sum(not r.ok for r in records)) == (12, 2)  # every request ran


def test_a_level_whose_candidate_stalls_is_decided_after_one_run() -> None:
    prof = GateProfile(concurrency=(4,), input_len=4, output_len=4, runs=3, max_runs=6, warmup=0,
                       stall_timeout_s=0.5, timeout_s=30.0)
    events: list[tuple[str, dict[str, Any]]] = []

    async def go() -> Any:
        async with serving(stalls=1) as (url, _srv):
            return await runner._run_level(4, url, None, None, prof.workload(), prof,
                                           lambda kind, data: events.append((kind, data)))

    t0 = time.monotonic()
    lv = _run(go())
    took = time.monotonic() - t0
    assert (lv.verdict, lv.failed_requests, len(lv.runs)) == ("fail", 1, 1)
    assert lv.reasons == ("C=4: 1 failed requests (allowed 0): stalled: no byte for 0.5s",)
    # no second run was measured; a reference measures its 6 runs last index first
    # (decide.reference_order), so the one it measured is run 5
    assert [d["index"] for k, d in events if k == "run"] == [5]
    assert took < 10.0  # loose on purpose (a loaded machine): the events above are the proof
