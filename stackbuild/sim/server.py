"""The simulator's HTTP server (aiohttp): SGLang's endpoints over the timing model.

Lifecycle as in sglang: nothing listens while "weights load" (--load-s), then
/health and /health_generate answer 503 until warmup ends (--warmup-s), then
200 after a one-token generation. SIGTERM/SIGINT shut down cleanly (exit 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from stackbuild.sim import metrics, shapes
from stackbuild.sim.calibration import PROFILES, SimProfile
from stackbuild.sim.faults import Fault
from stackbuild.sim.generation import Generation, Serving
from stackbuild.sim.scheduler import Engine, SimRequest
from stackbuild.sim.shapes import WEIGHT_VERSION
from stackbuild.sim.startup import AllReduceSetup, allreduce_lines

SGLANG_VERSION = "0.5.23"
HEALTH_CHECK_TIMEOUT_S = 20  # sglang's SGLANG_HEALTH_CHECK_TIMEOUT default
CONTEXT_LEN = 262144
FLUSHED = ("Cache flushed.\nPlease check backend logs for more details. (When there are running "
           "or waiting requests, the operation will not be performed.)\n")


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
    # sglang's --context-length (the model's own when not given)
    context_length: int = CONTEXT_LEN
    # sglang's --weight-version: a label every answer, /get_model_info and /server_info carry
    weight_version: str = WEIGHT_VERSION
    # what it logs about its all-reduce path at startup, as sglang would (sim/startup.py)
    allreduce: AllReduceSetup = field(default_factory=AllReduceSetup)

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model_path


class SimServer:
    def __init__(self, opts: SimOptions) -> None:
        self.opts = opts
        self.profile: SimProfile = PROFILES[opts.profile].with_max_running(opts.max_running_requests)
        self.engine = Engine(self.profile, speed=opts.speed, seed=opts.seed, slow=opts.fault.slow)
        self.hist = metrics.Metrics()
        self.up = False
        self.started_at = time.time()
        self.gen = Generation(Serving(opts.fault, opts.model_name, opts.context_length,
                                      self.reserved_tokens, self.profile, self.engine, self.hist,
                                      weight_version=opts.weight_version))

    @property
    def reserved_tokens(self) -> int:
        """Output slots EAGLE reserves on top of the input (managers/utils.py:484-500)."""
        p = self.profile
        if not p.speculative:
            return 0
        return max(p.topk * p.spec_steps, int(self._server_args()["speculative_num_draft_tokens"]))

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
        r.add_get("/get_weight_version", self.weight_version)
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
        r.add_route("GET", "/flush_cache", self.flush_cache)
        r.add_route("POST", "/flush_cache", self.flush_cache)
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
            "context_length": o.context_length,
            "launch_command": self._launch_command(),
            "weight_version": o.weight_version,
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
        if o.context_length != CONTEXT_LEN:
            argv += ["--context-length", str(o.context_length)]
        if o.weight_version != WEIGHT_VERSION:
            argv += ["--weight-version", o.weight_version]
        return " ".join(argv)

    async def server_info(self, request: web.Request) -> web.Response:
        e = self.engine
        state = {
            "effective_max_running_requests_per_dp": self.profile.max_running,
            "memory_usage": {"weight": 0.0, "kvcache": 0.0,
                             "token_capacity": self.opts.context_length},
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
            "weight_version": self.opts.weight_version,
        })

    async def weight_version(self, request: web.Request) -> web.Response:
        return web.json_response({"weight_version": self.opts.weight_version})

    def _card(self) -> dict[str, Any]:
        # protocol.py ModelCard; http_server.py sets root to the served name
        return {"id": self.opts.model_name, "object": "model", "created": int(time.time()),
                "owned_by": "sglang", "root": self.opts.model_name, "parent": None,
                "max_model_len": self.opts.context_length}

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
        e = self.engine
        text = metrics.render(
            self.opts.model_name, running=len(e.running), queued=len(e.waiting),
            gen_throughput=e.last_gen_throughput, accept_length=e.avg_accept_length,
            hist=self.hist,
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
        return await self.gen.serve(request, "generate")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self.gen.serve(request, "completions")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self.gen.serve(request, "chat")

    async def flush_cache(self, request: web.Request) -> web.Response:
        """http_server.py:1025-1040 and scheduler_components/flush_wrapper.py:22-61: flushed at
        once when idle; with ?timeout=S it waits up to S seconds for idle; else 400."""
        try:
            timeout = float(request.query.get("timeout", "0") or 0)
        except ValueError:
            timeout = -1.0
        if not timeout >= 0:
            return web.json_response(shapes.error_response(
                400, "timeout: Input should be greater than or equal to 0", "Bad Request"),
                status=400)
        e = self.engine
        until = time.monotonic() + timeout
        while (e.running or e.waiting) and time.monotonic() < until:
            await asyncio.sleep(0.05)
        if e.running or e.waiting:
            msg = "Timed out waiting for idle state." if timeout else "Flush cache failed.\n"
            return web.Response(status=400, text=msg)
        return web.Response(text=FLUSHED)


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
    for line in allreduce_lines(opts.allreduce):  # sglang logs them while the model runner starts
        print(line, flush=True)
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
