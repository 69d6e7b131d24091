"""The simulator's generation routes: /generate, /v1/completions, /v1/chat/completions.

How sglang 0.5.23 serves them (paths under sglang/srt/ of the wheel), and what is kept:
- a request is refused with one of three error bodies (stackbuild.sim.api);
- a prompt as long as the context, or one whose max_new_tokens would not fit, is refused
  before it runs (managers/tokenizer_manager.py:1333-1378): a 400 on every route, except a
  streamed /generate, whose 200 is already sent (entrypoints/http_server.py:952-979: the
  error comes as an SSE event);
- a list of prompts is a batch: /generate answers a list, the OpenAI routes one choice per
  prompt (tokenizer_manager.py:2079-2140, serving_completions.py:532-646);
- a non-streamed request whose client went away is aborted: checked on every output while
  it runs and every SGLANG_REQUEST_STATE_WAIT_TIMEOUT (4 s, environ.py:1679) while it waits
  (tokenizer_manager.py:1953-2077);
- the OpenAI routes send their HTTP 200 only with the first chunk, i.e. the first token
  (serving_completions.py:197-223, serving_chat.py:2413-2439 "kick-start the generator");
  /generate returns its StreamingResponse at once (http_server.py:981-985), so the 200 goes
  out before the first token.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from stackbuild.sim import api, lm, shapes
from stackbuild.sim.calibration import SimProfile
from stackbuild.sim.faults import Fault
from stackbuild.sim.metrics import Metrics
from stackbuild.sim.scheduler import Engine, SimRequest
from stackbuild.sim.text import VOCAB, detokenize, greedy_ids

STOP_ID = VOCAB.index(".")
WAIT_TIMEOUT_S = 4.0  # SGLANG_REQUEST_STATE_WAIT_TIMEOUT (environ.py:1679)
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


@dataclass
class Job:
    """One prompt of a request, its decided tokens and how far it got."""

    p: api.GenParams
    req: SimRequest
    stopped: bool
    lps: list[float]
    tops: list[list[tuple[float, int]]]
    numerics: lm.Numerics
    sent: int = 0


def _gone(request: web.Request) -> bool:
    t = request.transport
    return t is None or t.is_closing()


@dataclass
class Serving:
    """What the generation routes need of the server."""

    fault: Fault
    model_name: str
    context_length: int
    reserved_tokens: int  # output slots EAGLE reserves on top of the input
    profile: SimProfile
    engine: Engine
    hist: Metrics
    generations: int = 0
    weight_version: str = "default"  # --weight-version: what every answer's meta_info says


class Generation:
    def __init__(self, serving: Serving) -> None:
        self.s = serving

    # ---- request -> jobs -------------------------------------------------------
    async def serve(self, request: web.Request, route: api.Route) -> web.StreamResponse:
        s = self.s
        media = request.headers.get("Content-Type", "").lower().split(";", 1)[0].strip()
        body: Any = None
        try:
            if route != "generate" and media != "application/json":
                # http_server.py:695-708 validate_json_request
                raise api.BadRequest("Unsupported Media Type: Only 'application/json' is "
                                     "allowed", "validation")
            try:
                body = await request.json()
            except (json.JSONDecodeError, UnicodeDecodeError):
                raise api.BadRequest("JSON decode error", "validation") from None
            parsed = api.parse(route, body, uuid.uuid4().hex, s.model_name,
                               default_system=s.fault.default_system, weight_version=s.weight_version)
            for p in parsed.items:
                api.check_context(p, s.context_length, s.reserved_tokens)
        except api.BadRequest as err:
            if route == "generate" and err.shape == "value" and isinstance(body, dict) \
                    and body.get("stream"):
                return await self._stream_error(request, str(err))
            return web.json_response(shapes.error_body(route, err), status=400)
        # no warmup check: sglang's /generate serves as soon as the port is open; only
        # /health and /health_generate answer 503 while the server is Starting
        s.generations += 1
        fault = s.fault
        if fault.name == "die-after" and s.generations > fault.after:
            # a crash, not a shutdown: in-flight streams are cut mid-way
            sys.stderr.write(f"sim: fault die-after:{fault.after}: dying now\n")
            sys.stderr.flush()
            os._exit(1)
        if fault.name == "fail-first-generation" and s.generations == 1:
            return web.json_response(shapes.error_response(
                500, "CUDA error: an illegal memory access was encountered",
                "InternalServerError"), status=500)
        in_flight = len(s.engine.running) + len(s.engine.waiting) + len(parsed.items)
        jobs = [self._job(p, fault.numerics_at(in_flight)) for p in parsed.items]
        stream = parsed.items[0].stream
        for j in jobs:
            if j.req.token_ids or stream:
                s.engine.submit(j.req)
        try:
            if stream:
                return await self._stream(request, jobs, parsed.batch)
            return await self._whole(request, jobs, parsed.batch)
        finally:
            for j in jobs:
                if j.req.remaining > 0:
                    j.req.cancelled = True

    def _job(self, p: api.GenParams, numerics: lm.Numerics) -> Job:
        lps: list[float] = []
        tops: list[list[tuple[float, int]]] = []
        if p.temperature <= 0:
            state = lm.start(p.text, None if p.ids is None else list(p.ids))
            limit = p.max_new_tokens if p.max_new_tokens is not None else \
                self.s.context_length - p.prompt_tokens
            ids, lps, tops = lm.greedy(state, limit, numerics,
                                       stop=None if p.ignore_eos else STOP_ID,
                                       logprobs=p.return_logprob, prompt_len=p.prompt_tokens,
                                       top_k=p.top_logprobs_num if p.return_logprob else 0)
        else:
            ids = greedy_ids(p.key, 4096 if p.max_new_tokens is None else p.max_new_tokens,
                             temperature=p.temperature, rid=p.rid)
        stopped = False
        fault = self.s.fault
        if fault.name == "garbage" and fault.garbage == "repeat":
            ids = [0] * len(ids)  # what NaN logits look like after argmax
        elif not p.ignore_eos and STOP_ID in ids:
            ids = ids[: ids.index(STOP_ID) + 1]
            stopped = True
        req = SimRequest(rid=p.rid, prompt_tokens=p.prompt_tokens, token_ids=ids)
        return Job(p, req, stopped, lps, tops, numerics)

    # ---- answers -----------------------------------------------------------------
    def _text(self, ids: list[int], *, first: bool = True) -> str:
        """The text of output ids; `first`: they start the output (a delta does not)."""
        fault = self.s.fault
        g = fault.garbage if fault.name == "garbage" else None
        if g == "empty":
            return ""
        if g == "fffd":
            return "\ufffd" * len(ids)
        return detokenize(ids, legacy_space=fault.legacy_space and first)

    def _meta(self, j: Job, n: int, fr: dict[str, Any] | None) -> dict[str, Any]:
        accept = j.req.spec_accept_length if self.s.profile.speculative else None
        meta = shapes.meta_info(j.p, n, fr, j.req.arrived, accept)
        if j.p.return_logprob:
            meta.update(shapes.logprob_fields(j.p, j.req.token_ids[:n], j.lps[:n], j.tops[:n],
                                              j.numerics))
        return meta

    def _fr(self, j: Job, done: bool) -> dict[str, Any] | None:
        return shapes.finish_reason(done, j.stopped, j.sent, STOP_ID)

    def _generate_out(self, j: Job, done: bool, batch: bool) -> dict[str, Any]:
        ids = j.req.token_ids[:j.sent]
        out: dict[str, Any] = {"text": self._text(ids), "output_ids": ids,
                               "meta_info": self._meta(j, j.sent, self._fr(j, done))}
        if batch:
            out["index"] = j.p.index
        return out

    def _finished(self, j: Job, streaming: bool) -> None:
        self.s.hist.finished(streaming, j.p.prompt_tokens, j.sent,
                             time.monotonic() - j.req.arrived)

    async def _whole(self, request: web.Request, jobs: list[Job], batch: bool
                     ) -> web.Response:
        for j in jobs:
            first = True
            while j.req.remaining > 0 or not j.req.out.empty():
                try:
                    await asyncio.wait_for(j.req.out.get(), WAIT_TIMEOUT_S)
                except TimeoutError:
                    if _gone(request):  # type 1: the client left while the request waited
                        return web.Response(status=499)
                    continue
                if first:
                    self.s.hist.ttft(False, time.monotonic() - j.req.arrived)
                    first = False
                if _gone(request):  # type 3: the client left while the request ran
                    return web.Response(status=499)
            j.sent = len(j.req.token_ids)
            self.s.engine.record_emit(j.req, j.sent)
            self._finished(j, False)
        p = jobs[0].p
        if p.route == "generate":
            outs = [self._generate_out(j, True, batch) for j in jobs]
            return web.json_response(outs if batch else outs[0])
        return web.json_response(shapes.full(
            p, int(time.time()), [(self._text(j.req.token_ids), self._fr(j, True)) for j in jobs],
            sum(j.p.prompt_tokens for j in jobs), sum(j.sent for j in jobs)))

    async def _stream_error(self, request: web.Request, message: str) -> web.StreamResponse:
        """A streamed /generate refused while serving: http_server.py:960-979."""
        resp = web.StreamResponse(headers=_SSE_HEADERS)
        await resp.prepare(request)
        await resp.write(_sse({"error": {"message": message, "type": "invalid_request_error",
                                         "code": 400, "retryable": False}}))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _steps(self, jobs: list[Job]) -> asyncio.Queue[tuple[Job, int]]:
        """Every job's decode steps, merged in the order they come."""
        merged: asyncio.Queue[tuple[Job, int]] = asyncio.Queue()

        async def pump(j: Job) -> None:
            left = len(j.req.token_ids)
            while left > 0:
                n = await j.req.out.get()
                while not j.req.out.empty():  # coalesce steps the writer fell behind on
                    n += j.req.out.get_nowait()
                left -= n
                await merged.put((j, n))

        for j in jobs:
            asyncio.get_running_loop().create_task(pump(j))
        return merged

    async def _stream(self, request: web.Request, jobs: list[Job], batch: bool
                      ) -> web.StreamResponse:
        s, p = self.s, jobs[0].p
        resp = web.StreamResponse(headers=_SSE_HEADERS)
        if p.route == "generate":
            await resp.prepare(request)
        created = int(time.time())
        steps = await self._steps(jobs)
        left = sum(1 for j in jobs if j.req.token_ids)
        stall = s.fault.name == "stall-stream"
        last: dict[int, float] = {}
        while left:
            j, n = await steps.get()
            now = time.monotonic()
            if j.sent == 0:
                s.hist.ttft(True, now - j.req.arrived)
            else:
                s.hist.itl.observe(now - last[j.p.index])
            last[j.p.index] = now
            new = j.req.token_ids[j.sent: j.sent + n]
            j.sent += n
            done = j.sent >= len(j.req.token_ids)
            if not resp.prepared:
                await resp.prepare(request)  # the 200 goes out with the first token
            await resp.write(b"".join(_sse(c) for c in self._chunks(j, new, done, created, batch)))
            s.engine.record_emit(j.req, n)
            if done:
                left -= 1
                self._finished(j, True)
            if stall and j.sent >= len(j.req.token_ids) // 2:
                j.req.cancelled = True
                await asyncio.sleep(3600)  # the stream hangs; the client's timeout ends it
        if not resp.prepared:
            await resp.prepare(request)
        if p.route != "generate" and p.include_usage:
            prompt, out = sum(j.p.prompt_tokens for j in jobs), sum(j.sent for j in jobs)
            u = shapes.chat_usage_chunk if p.route == "chat" else shapes.completion_usage_chunk
            await resp.write(_sse(u(p, created, prompt, out)))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def _chunks(self, j: Job, new: list[int], done: bool, created: int, batch: bool
                ) -> list[dict[str, Any]]:
        p, fr = j.p, self._fr(j, done)
        if p.route == "generate":
            # sglang's default (non-incremental) stream: cumulative text and ids
            return [self._generate_out(j, done, batch)]
        delta = self._text(new, first=j.sent == len(new))
        if p.route == "completions":
            return [shapes.completion_chunk(p, created, p.index, delta, fr)]
        out = []
        if j.sent == len(new):
            out.append(shapes.chat_chunk(p, created, p.index, role=True))
        if delta:
            out.append(shapes.chat_chunk(p, created, p.index, content=delta))
        if done:
            out.append(shapes.chat_chunk(p, created, p.index, fr=fr))
        return out
