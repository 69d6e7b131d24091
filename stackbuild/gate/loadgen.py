"""The load generator: closed-loop streaming clients over aiohttp, one run at a time.

A run at concurrency C sends max(C * requests_per_slot, min_requests) requests through C workers
(each sends its next request when its last one finished) and measures from the
first send to the last byte. Token counts come from the server's usage /
meta_info and are cross-checked against what was streamed.

A run given `fail_after` ends as soon as more requests than that failed: the gate fails a
level on its failed requests whatever else it measures, so once they are past what the
profile allows the rest of the run cannot change the verdict, and a stalled server costs
one stall bound instead of one per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from stackbuild.gate.result import RunMetrics, Workload
from stackbuild.gate.stats import percentiles

MAX_ERRORS_KEPT = 5
# token ids drawn for prompts: away from the special/low ids of common vocabularies
PROMPT_ID_RANGE = (1000, 30000)


@dataclass
class RequestRecord:
    ok: bool = False
    error: str = ""
    start: float = 0.0
    end: float = 0.0
    ttft: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    output_tokens: int = 0  # from the server's usage / meta_info
    streamed_tokens: int = 0  # what the chunks themselves show (generate) or chunk count
    prompt_tokens: int = 0
    mismatch: bool = False
    text: str = ""


def prompt_ids(wl: Workload, concurrency: int, run: int, index: int) -> list[int]:
    """Token-id prompt for one request; fixed by the workload seed, distinct per request."""
    rng = random.Random(f"{wl.seed}:{concurrency}:{run}:{index}")
    return [rng.randrange(*PROMPT_ID_RANGE) for _ in range(wl.input_len)]


def request_body(wl: Workload, ids: list[int] | str) -> tuple[str, dict[str, Any]]:
    """(path, JSON body) for one streamed greedy request of the workload; the prompt as token ids, or
    as text (what a gateway takes: smg's `prompt` is a string or strings, not token ids)."""
    if wl.api == "generate":
        return "/generate", {
            **({"text": ids} if isinstance(ids, str) else {"input_ids": ids}),
            "sampling_params": {"max_new_tokens": wl.output_len, "temperature": 0.0,
                                "ignore_eos": wl.ignore_eos},
            "stream": True,
        }
    return "/v1/completions", {
        "model": wl.model,
        "prompt": ids,
        "max_tokens": wl.output_len,
        "temperature": 0.0,
        "ignore_eos": wl.ignore_eos,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def _on_event(rec: RequestRecord, api: str, data: dict[str, Any], now: float) -> None:
    if api == "generate":
        meta = data.get("meta_info") or {}
        n = int(meta.get("completion_tokens") or 0)
        ids = data.get("output_ids")
        if isinstance(ids, list) and len(ids) != n:
            rec.mismatch = True
        if n > rec.output_tokens:
            rec.chunk_times.append(now)
            rec.output_tokens = n
            rec.streamed_tokens = len(ids) if isinstance(ids, list) else n
        rec.prompt_tokens = int(meta.get("prompt_tokens") or 0)
        if isinstance(data.get("text"), str):
            rec.text = data["text"]
        return
    choices = data.get("choices") or []
    if choices:
        rec.chunk_times.append(now)
        rec.streamed_tokens += 1
        c = choices[0]
        rec.text += c.get("text") or (c.get("delta") or {}).get("content") or ""
    usage = data.get("usage")
    if usage:
        rec.output_tokens = int(usage.get("completion_tokens") or 0)
        rec.prompt_tokens = int(usage.get("prompt_tokens") or 0)


async def _read_stream(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], wl: Workload,
    rec: RequestRecord,
) -> bool:
    """Read one SSE response into rec; True when `data: [DONE]` arrived."""
    done = False
    async with session.post(url, json=body,
                            timeout=aiohttp.ClientTimeout(total=wl.timeout_s,
                                                          sock_read=wl.stall_timeout_s)) as resp:
        if resp.status != 200:
            rec.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
            return False
        buf = b""
        async for data in resp.content.iter_any():
            now = time.perf_counter()
            buf += data
            while (cut := buf.find(b"\n\n")) >= 0:
                event, buf = buf[:cut], buf[cut + 2 :]
                if not event.startswith(b"data: "):
                    continue
                payload = event[6:]
                if payload == b"[DONE]":
                    done = True
                    continue
                obj = json.loads(payload)
                if "error" in obj or obj.get("object") == "error":
                    rec.error = f"server error: {str(obj)[:200]}"
                    return False
                _on_event(rec, wl.api, obj, now)
    return done


async def stream_request(
    session: aiohttp.ClientSession, url: str, wl: Workload, ids: list[int] | str
) -> RequestRecord:
    path, body = request_body(wl, ids)
    rec = RequestRecord(start=time.perf_counter())
    done = False
    try:
        done = await _read_stream(session, url + path, body, wl, rec)
    except TimeoutError:
        # sock_read fires when no byte came for stall_timeout_s; total when the request ran out
        stalled = time.perf_counter() - rec.start < wl.timeout_s - 0.05
        rec.error = (f"stalled: no byte for {wl.stall_timeout_s:g}s" if stalled
                     else f"timeout after {wl.timeout_s:g}s")
    except (aiohttp.ClientError, json.JSONDecodeError, OSError) as err:
        rec.error = f"{type(err).__name__}: {err}"[:200]
    rec.end = time.perf_counter()
    if rec.error:
        return rec
    if not done:
        rec.error = "stream ended without data: [DONE]"
    elif rec.output_tokens <= 0:
        rec.error = "no tokens (usage missing or zero)"
    else:
        rec.ok = True
        rec.ttft = rec.chunk_times[0] - rec.start if rec.chunk_times else None
        # chunks can carry several tokens (speculative steps), never fewer than one
        if rec.streamed_tokens > rec.output_tokens or (
            wl.ignore_eos and rec.output_tokens != wl.output_len):
            rec.mismatch = True
    return rec


def summarize(
    records: list[RequestRecord], concurrency: int, index: int, duration: float,
    started: float | None = None,
) -> RunMetrics:
    ok = [r for r in records if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    in_tokens = sum(r.prompt_tokens for r in ok)
    ttft = [r.ttft * 1000 for r in ok if r.ttft is not None]
    itl = [(b - a) * 1000 for r in ok for a, b in zip(r.chunk_times, r.chunk_times[1:],
                                                       strict=False)]
    tpot = [(r.end - r.start - (r.ttft or 0)) * 1000 / (r.output_tokens - 1)
            for r in ok if r.output_tokens > 1]
    e2e = [(r.end - r.start) * 1000 for r in ok]
    errors: list[str] = []
    for r in records:
        if r.error and r.error not in errors and len(errors) < MAX_ERRORS_KEPT:
            errors.append(r.error)
    return RunMetrics(
        concurrency=concurrency,
        index=index,
        duration_s=duration,
        completed=len(ok),
        failed=len(records) - len(ok),
        input_tokens=in_tokens,
        output_tokens=out_tokens,
        output_tok_s=out_tokens / duration if duration > 0 else 0.0,
        total_tok_s=(in_tokens + out_tokens) / duration if duration > 0 else 0.0,
        ttft_ms=percentiles(ttft),
        itl_ms=percentiles(itl),
        tpot_ms=percentiles(tpot),
        e2e_ms=percentiles(e2e),
        token_count_mismatches=sum(1 for r in ok if r.mismatch),
        errors=tuple(errors),
        started=started,
    )


def requests_per_run(wl: Workload, concurrency: int) -> int:
    return max(concurrency * wl.requests_per_slot, wl.min_requests)


def new_session(concurrency: int) -> aiohttp.ClientSession:
    conn = aiohttp.TCPConnector(limit=max(concurrency, 1) + 4, ttl_dns_cache=300)
    return aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None))


async def _preconnect(session: aiohttp.ClientSession, url: str) -> None:
    """One keep-alive connection into the pool (a cheap GET); a failure shows in the run."""
    with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
        async with session.get(url + "/v1/models", timeout=aiohttp.ClientTimeout(total=5)) as r:
            await r.read()


async def run_requests(
    url: str,
    wl: Workload,
    concurrency: int,
    prompts: list[list[int]],
    *,
    on_done: Callable[[RequestRecord], None] | None = None,
    fail_after: int | None = None,
) -> tuple[list[RequestRecord], float]:
    """Send `prompts` through `concurrency` closed-loop workers; (records, wall seconds).

    With `fail_after`, the run stops once more requests than that failed: the requests still in
    flight are cancelled (not recorded) and nothing more is sent.
    """
    records: list[RequestRecord] = []
    it = iter(prompts)
    decided = asyncio.Event()

    async with new_session(concurrency) as session:

        async def worker() -> None:
            for ids in it:
                if decided.is_set():
                    return
                rec = await stream_request(session, url, wl, ids)
                records.append(rec)
                if on_done:
                    on_done(rec)
                if fail_after is not None and not rec.ok and sum(not r.ok for r in records) > fail_after:
                    decided.set()

        workers = min(concurrency, len(prompts))
        # Open the workers' connections before the clock starts: at C=256 connecting took
        # ~0.07 s before the server saw a request, ~1% of the window charged to the server.
        await asyncio.gather(*(_preconnect(session, url) for _ in range(workers)))
        t0 = time.perf_counter()
        load: asyncio.Future[Any] = asyncio.gather(*(worker() for _ in range(workers)))
        stop: asyncio.Future[Any] = asyncio.ensure_future(decided.wait())
        try:
            await asyncio.wait({load, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not load.done():  # decided (or this task cancelled): the rest cannot change the verdict
                load.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await load
            me = asyncio.current_task()
            if me is not None and me.cancelling():
                # the cancellation swallowed just now may have been this task's own (a signal, the
                # gate's deadline), not only `load`'s: it goes on up
                raise asyncio.CancelledError
        t1 = max((r.end for r in records), default=t0)
    return records, max(t1 - t0, 0.0)


async def run_once(
    url: str,
    wl: Workload,
    concurrency: int,
    index: int,
    *,
    on_done: Callable[[RequestRecord], None] | None = None,
    fail_after: int | None = None,
) -> RunMetrics:
    n = requests_per_run(wl, concurrency)
    prompts = [prompt_ids(wl, concurrency, index, i) for i in range(n)]
    started = time.time()
    records, duration = await run_requests(url, wl, concurrency, prompts, on_done=on_done, fail_after=fail_after)
    return summarize(records, concurrency, index, duration, started)


async def warmup(url: str, wl: Workload, concurrency: int) -> list[RequestRecord]:
    if wl.warmup <= 0:
        return []
    prompts = [prompt_ids(wl, 0, -1, i) for i in range(wl.warmup)]
    records, _ = await run_requests(url, wl, min(concurrency, wl.warmup), prompts)
    return records
