"""The simulator's HTTP server (aiohttp): SGLang's endpoints over the timing model.

Lifecycle as in sglang: nothing listens while "weights load" (--load-s), then
/health and /health_generate answer 503 until warmup ends (--warmup-s), then
200 after a one-token generation. SIGTERM/SIGINT shut down cleanly (exit 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from stackbuild.sim import api, lm, metrics
from stackbuild.sim.calibration import PROFILES, SimProfile
from stackbuild.sim.faults import Fault
from stackbuild.sim.scheduler import Engine, SimRequest
from stackbuild.sim.text import VOCAB, detokenize, greedy_ids

SGLANG_VERSION = "0.5.23"
HEALTH_CHECK_TIMEOUT_S = 20  # sglang's SGLANG_HEALTH_CHECK_TIMEOUT default
CONTEXT_LEN = 262144
STOP_ID = VOCAB.index(".")
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


@dataclass(frozen=True)
class SimOptions:
    host: str = "127.0.0.1"
    port: int = 30000
    profile: str = "baseline"
    speed: float = 1.0
    fault: Fault = field(default_factory=Fault)
    warmup_s: float = 1.0
    load_s: float = 0.0
    seed: int = 0
    model_path: str = "sim/model"
    served_model_name: str | None = None
    # sglang's --max-running-requests; None keeps the profile's default (48 with speculation)
    max_running_requests: int | None = None
    # sglang serves /metrics only with --enable-metrics (http_server.py:314)
    enable_metrics: bool = False

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model_path


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class SimServer:
    def __init__(self, opts: SimOptions) -> None:
        self.opts = opts
        self.profile: SimProfile = PROFILES[opts.profile].with_max_running(opts.max_running_requests)
        self.engine = Engine(self.profile, speed=opts.speed, seed=opts.seed, slow=opts.fault.slow)
        self.hist = metrics.Metrics()
        self.up = False
        self.generations = 0
        # rid -> (logprob of each greedy output token, this server's numerics)
        self._logprobs: dict[str, tuple[list[float], lm.Numerics]] = {}
        self.started_at = time.time()

    # ---- app ---------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health)
        r.add_get("/ready", self.ready)
        r.add_get("/server_info", self.server_info)
        r.add_get("/get_server_info", self.server_info)
        r.add_get("/model_info", self.model_info)
        r.add_get("/get_model_info", self.model_info)
        r.add_get("/v1/models", self.models)
        r.add_get("/v1/models/{model:.+}", self.model)
        if self.opts.enable_metrics:
            r.add_get("/metrics", self.metrics)
        r.add_get("/sim/stats", self.sim_stats)
        r.add_post("/sim/stats/reset", self.sim_reset)
        r.add_route("POST", "/generate", self.generate)
        r.add_route("PUT", "/generate", self.generate)
        r.add_post("/v1/completions", self.completions)
        r.add_post("/v1/chat/completions", self.chat)
        return app

    # ---- status endpoints ---------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        if not self.up:
            return web.Response(status=503)
        # like sglang (http_server.py health_generate): submit a one-token generation, then
        # once a second look whether *any* output arrived since; under load the running
        # batch answers for it, so /health never waits behind a full batch. 20 s, then 503.
        req = SimRequest(rid=f"HEALTH_CHECK_{uuid.uuid4().hex}", prompt_tokens=1,
                         token_ids=[1], counted=False)
        tic = time.time()
        self.engine.submit(req)
        try:
            while time.time() < tic + HEALTH_CHECK_TIMEOUT_S:
                await asyncio.sleep(1)
                if self.engine.last_output > tic:
                    return web.Response(status=200)
            return web.Response(status=503)
        finally:
            req.cancelled = True

    async def ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.up else 503)

    def _server_args(self) -> dict[str, Any]:
        p, o = self.profile, self.opts
        args: dict[str, Any] = {
            "model_path": o.model_path,
            "served_model_name": o.model_name,
            "host": o.host,
            "port": o.port,
            "tp_size": 8,
            "max_running_requests": p.max_running,
            "cuda_graph_max_bs_decode": 128,
            "enable_metrics": o.enable_metrics,
            "launch_command": self._launch_command(),
            "speculative_algorithm": "EAGLE3" if p.speculative else None,
        }
        if p.speculative:
            args.update(
                speculative_num_steps=p.spec_steps,
                speculative_eagle_topk=p.topk,
                speculative_num_draft_tokens=p.spec_steps + 1 if p.topk == 1 else 8,
            )
        return args

    def _launch_command(self) -> str:
        o = self.opts
        argv = ["python3", "-m", "sglang.launch_server", "--model-path", o.model_path,
                "--host", o.host, "--port", str(o.port)]
        if o.max_running_requests is not None:
            argv += ["--max-running-requests", str(o.max_running_requests)]
        if o.enable_metrics:
            argv.append("--enable-metrics")
        return " ".join(argv)

    async def server_info(self, request: web.Request) -> web.Response:
        e = self.engine
        state = {
            "effective_max_running_requests_per_dp": self.profile.max_running,
            "memory_usage": {"weight": 0.0, "kvcache": 0.0, "token_capacity": CONTEXT_LEN},
            "avg_spec_accept_length": e.avg_accept_length if self.profile.speculative else None,
            "last_gen_throughput": e.last_gen_throughput,
            "num_running_reqs": len(e.running),
            "num_queue_reqs": len(e.waiting),
        }
        body = {
            **self._server_args(),
            "startup_time": self.started_at,
            "internal_states": [state],
            "version": SGLANG_VERSION,
            "frontend": "python",
            # not in sglang: says what answers here, so nobody mistakes it for a GPU
            "sim": {"profile": self.profile.name, "speed": self.opts.speed,
                    "fault": self.opts.fault.name},
        }
        return web.json_response(body)

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response({
            "model_path": self.opts.model_path,
            "served_model_name": self.opts.model_name,
            "tokenizer_path": self.opts.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
        })

    def _card(self) -> dict[str, Any]:
        # protocol.py ModelCard; http_server.py sets root to the served name
        return {"id": self.opts.model_name, "object": "model", "created": int(time.time()),
                "owned_by": "sglang", "root": self.opts.model_name, "parent": None,
                "max_model_len": CONTEXT_LEN}

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [self._card()]})

    async def model(self, request: web.Request) -> web.Response:
        name = request.match_info["model"]
        if name != self.opts.model_name:
            return web.json_response({"error": {
                "message": f"The model '{name}' does not exist", "type": "invalid_request_error",
                "param": "model", "code": "model_not_found"}}, status=404)
        return web.json_response(self._card())

    async def metrics(self, request: web.Request) -> web.Response:
        e, t = self.engine, self.engine.totals
        text = metrics.render(
            self.opts.model_name, running=len(e.running), queued=len(e.waiting),
            gen_throughput=e.last_gen_throughput, accept_length=e.avg_accept_length,
            prompt_tokens=t.prompt_tokens, generation_tokens=t.output_tokens,
            requests=t.requests, hist=self.hist,
        )
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    async def sim_stats(self, request: web.Request) -> web.Response:
        body = self.engine.stats.as_dict()
        body["profile"] = self.profile.name
        body["speed"] = self.opts.speed
        return web.json_response(body)

    async def sim_reset(self, request: web.Request) -> web.Response:
        self.engine.reset_stats()
        return web.json_response({"reset": True})

    # ---- generation ---------------------------------------------------------
    async def generate(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "generate")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "completions")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "chat")

    def _error(self, status: int, message: str, kind: str) -> web.Response:
        body = {"object": "error", "message": message, "type": kind, "param": None,
                "code": status}
        return web.json_response(body, status=status)

    def _text(self, ids: list[int]) -> str:
        g = self.opts.fault.garbage if self.opts.fault.name == "garbage" else None
        if g == "empty":
            return ""
        if g == "fffd":
            return "\ufffd" * len(ids)
        return detokenize(ids)

    def _bad(self, route: api.Route, message: str) -> web.Response:
        if route == "generate":  # http_server.py _create_error_response
            return web.json_response({"error": {"message": message}}, status=400)
        return self._error(400, message, "Bad Request")

    async def _serve(self, request: web.Request, route: api.Route) -> web.StreamResponse:
        media = request.headers.get("Content-Type", "").lower().split(";", 1)[0].strip()
        if route != "generate" and media != "application/json":
            return self._bad(route, "Unsupported Media Type: Only 'application/json' is allowed")
        try:
            body = await request.json()
            p = api.parse(route, body, uuid.uuid4().hex, self.opts.model_name)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return self._bad(route, "request body is not valid JSON")
        except api.BadRequest as err:
            return self._bad(route, str(err))
        # no warmup check: sglang's /generate serves as soon as the port is open; only
        # /health and /health_generate answer 503 while the server is Starting
        self.generations += 1
        fault = self.opts.fault
        if fault.name == "die-after" and self.generations > fault.after:
            # a crash, not a shutdown: in-flight streams are cut mid-way
            sys.stderr.write(f"sim: fault die-after:{fault.after}: dying now\n")
            sys.stderr.flush()
            os._exit(1)
        if fault.name == "fail-first-generation" and self.generations == 1:
            return self._error(500, "CUDA error: an illegal memory access was encountered",
                               "InternalServerError")
        numerics = fault.numerics
        lps: list[float] = []
        if p.temperature <= 0:
            state = lm.start(p.text, None if p.ids is None else list(p.ids))
            limit = p.max_new_tokens if p.max_new_tokens is not None else \
                CONTEXT_LEN - p.prompt_tokens
            ids, lps = lm.greedy(state, limit, numerics, stop=None if p.ignore_eos else STOP_ID,
                                 logprobs=p.return_logprob)
        else:
            ids = greedy_ids(p.key, 4096 if p.max_new_tokens is None else p.max_new_tokens,
                             temperature=p.temperature, rid=p.rid)
        stopped = False
        if fault.name == "garbage" and fault.garbage == "repeat":
            ids = [0] * len(ids)  # what NaN logits look like after argmax
        elif not p.ignore_eos and STOP_ID in ids:
            ids = ids[: ids.index(STOP_ID) + 1]
            stopped = True
        req = SimRequest(rid=p.rid, prompt_tokens=p.prompt_tokens, token_ids=ids)
        if not ids and not p.stream:  # max_new_tokens 0: prefill only, an empty answer
            return await self._whole(p, req, stopped)
        self._logprobs[p.rid] = (lps, numerics)
        self.engine.submit(req)
        try:
            if p.stream:
                return await self._stream(request, p, req, stopped)
            return await self._whole(p, req, stopped)
        finally:
            self._logprobs.pop(p.rid, None)
            if req.remaining > 0:
                req.cancelled = True

    def _meta(self, p: api.GenParams, req: SimRequest, n: int, fr: dict[str, Any] | None
              ) -> dict[str, Any]:
        meta = api.meta_info(p, n, fr, req.arrived, self._accept(req))
        if p.return_logprob:
            lps, numerics = self._logprobs.get(p.rid, ([], lm.Numerics()))
            meta.update(api.logprob_fields(p, req.token_ids[:n], lps[:n], numerics))
        return meta

    def _accept(self, req: SimRequest) -> float | None:
        return req.spec_accept_length if self.profile.speculative else None

    async def _whole(self, p: api.GenParams, req: SimRequest, stopped: bool) -> web.Response:
        started = req.arrived
        first = True
        while req.remaining > 0 or not req.out.empty():
            await req.out.get()
            if first:
                self.hist.ttft.observe(time.monotonic() - started)
                first = False
        n = len(req.token_ids)
        self.engine.record_emit(req, n)
        self.hist.e2e.observe(time.monotonic() - started)
        fr = api.finish_reason(True, stopped, n, STOP_ID)
        text = self._text(req.token_ids)
        if p.route == "generate":
            meta = self._meta(p, req, n, fr)
            return web.json_response({"text": text, "output_ids": req.token_ids,
                                      "meta_info": meta})
        return web.json_response(api.oai_full(p, int(time.time()), text, fr, n))

    async def _stream(
        self, request: web.Request, p: api.GenParams, req: SimRequest, stopped: bool
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers=_SSE_HEADERS)
        await resp.prepare(request)
        created = int(time.time())
        sent = 0
        total = len(req.token_ids)
        stall_at = total // 2 if self.opts.fault.name == "stall-stream" else None
        last = req.arrived
        while sent < total:
            n = await req.out.get()
            while not req.out.empty():  # coalesce steps the writer fell behind on
                n += req.out.get_nowait()
            now = time.monotonic()
            if sent == 0:
                self.hist.ttft.observe(now - req.arrived)
            else:
                self.hist.itl.observe(now - last)
            last = now
            new = req.token_ids[sent : sent + n]
            sent += n
            done = sent >= total
            fr = api.finish_reason(done, stopped, sent, STOP_ID)
            if p.route == "generate":
                # sglang's default (non-incremental) stream: cumulative text and ids
                chunk = {"text": self._text(req.token_ids[:sent]),
                         "output_ids": req.token_ids[:sent],
                         "meta_info": self._meta(p, req, sent, fr)}
            else:
                if sent == n and p.route == "chat":
                    await resp.write(_sse(api.oai_chunk(p, created, "", None, role=True)))
                chunk = api.oai_chunk(p, created, self._text(new), fr)
            await resp.write(_sse(chunk))
            self.engine.record_emit(req, n)
            if stall_at is not None and sent >= stall_at:
                req.cancelled = True
                await asyncio.sleep(3600)  # the stream hangs; the client's timeout ends it
        if p.route != "generate" and p.include_usage:
            await resp.write(_sse(api.oai_usage_chunk(p, created, total)))
        await resp.write(b"data: [DONE]\n\n")
        self.hist.e2e.observe(time.monotonic() - req.arrived)
        await resp.write_eof()
        return resp


async def serve(opts: SimOptions, *, ready_msg: bool = True) -> int:
    """Run until SIGTERM/SIGINT; returns the exit code."""
    if opts.fault.name == "crash-on-start":
        await asyncio.sleep(min(opts.load_s, 1.0))
        sys.stderr.write("sim: fault crash-on-start: RuntimeError: CUDA error: no kernel image "
                         "is available for execution on the device\n")
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if opts.load_s:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), opts.load_s)
    if stop.is_set():
        return 0
    server = SimServer(opts)
    server.engine.start()
    runner = web.AppRunner(server.app(), access_log=None, handle_signals=False,
                           shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, opts.host, opts.port, reuse_address=True, backlog=1024)
    await site.start()
    if ready_msg:
        print(f"sim: {server.profile.name} listening on http://{opts.host}:{opts.port} "
              f"(speed {opts.speed}, fault {opts.fault.name or 'none'})", flush=True)
    if opts.fault.name != "never-ready":
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), opts.warmup_s)
        server.up = not stop.is_set()
        if server.up:
            print("sim: The server is fired up and ready to roll!", flush=True)
    await stop.wait()
    server.up = False
    await server.engine.stop()
    await runner.cleanup()
    return 0
