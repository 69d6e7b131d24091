"""The continuous-batching scheduler: admits requests, runs prefill and decode steps.

Model time is anchored to the event loop's clock: each step moves a deadline
forward by its model duration / speed and sleeps until then, so HTTP overhead
does not slow the simulated GPU down (unless the CPU cannot keep up at all, in
which case the lag is dropped rather than replayed as a burst).

The event loop sleeps in whole milliseconds (epoll), so below ~2 ms per step
(high --speed) tokens arrive in pairs: tok/s stays exact, ITL turns bursty. For
faithful ITL/TPOT keep the real step time above that (e.g. --speed <= 5).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from dataclasses import dataclass, field

from stackbuild.sim.calibration import SimProfile
from stackbuild.sim.model import Acceptance, Sampler

MAX_LAG_S = 0.05


@dataclass(eq=False)
class SimRequest:
    rid: str
    prompt_tokens: int
    token_ids: list[int]  # the whole continuation, decided up front (greedy)
    counted: bool = True  # health checks are not part of the stats
    emitted: int = 0
    arrived: float = field(default_factory=time.monotonic)
    out: asyncio.Queue[int] = field(default_factory=asyncio.Queue)  # token counts per step
    accept_steps: int = 0
    cancelled: bool = False
    acceptance: Acceptance | None = None  # its speculative acceptance (model.Acceptance)

    @property
    def remaining(self) -> int:
        return len(self.token_ids) - self.emitted

    @property
    def spec_accept_length(self) -> float:
        # the first token comes from prefill, not from a decode step
        return (self.emitted - 1) / self.accept_steps if self.accept_steps else 0.0


@dataclass
class Stats:
    """Ground truth for the gate's accuracy: tokens put on the wire and when."""

    requests: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    first_request_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    decode_steps: int = 0
    request_steps: int = 0  # sum over decode steps of the requests stepped
    accept_tokens: int = 0

    def on_request(self, req: SimRequest) -> None:
        self.requests += 1
        self.prompt_tokens += req.prompt_tokens
        if self.first_request_at is None:
            self.first_request_at = req.arrived

    def on_emit(self, n: int) -> None:
        now = time.monotonic()
        self.output_tokens += n
        if self.first_token_at is None:
            self.first_token_at = now
        self.last_token_at = now

    def as_dict(self) -> dict[str, float | int | str | None]:
        window = None
        if self.first_request_at is not None and self.last_token_at is not None:
            window = self.last_token_at - self.first_request_at
        return {
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "first_request_at": self.first_request_at,
            "first_token_at": self.first_token_at,
            "last_token_at": self.last_token_at,
            "window_s": window,
            "output_tok_s": self.output_tokens / window if window else None,
            "clock": "CLOCK_MONOTONIC seconds",
        }


class Engine:
    def __init__(self, profile: SimProfile, *, speed: float, seed: int, slow: float) -> None:
        self.profile = profile
        self.speed = speed
        self.sampler = Sampler(profile, seed, slow=slow)
        self.waiting: collections.deque[SimRequest] = collections.deque()
        self.running: list[SimRequest] = []
        self.stats = Stats()
        self.totals = Stats()  # never reset, for /metrics
        self.last_gen_throughput = 0.0
        self.last_output = 0.0
        self._wake = asyncio.Event()
        self._deadline = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def submit(self, req: SimRequest) -> None:
        if req.counted:
            self.stats.on_request(req)
            self.totals.on_request(req)
        self.waiting.append(req)
        self._wake.set()

    def reset_stats(self) -> None:
        self.stats = Stats()

    def record_emit(self, req: SimRequest, n: int) -> None:
        """Called by the HTTP layer once the tokens are written to the client."""
        if req.counted and n:
            self.stats.on_emit(n)
            self.totals.on_emit(n)

    async def _advance(self, model_ms: float) -> None:
        loop = asyncio.get_running_loop()
        self._deadline += model_ms / 1000.0 / self.speed
        delay = self._deadline - loop.time()
        if delay < -MAX_LAG_S:
            self._deadline = loop.time()
        await asyncio.sleep(max(delay, 0.0))

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self.running = [r for r in self.running if r.remaining > 0 and not r.cancelled]
            if not self.running and not self.waiting:
                self._wake.clear()
                await self._wake.wait()
                self._deadline = loop.time()
            new: list[SimRequest] = []
            while self.waiting and len(self.running) + len(new) < self.profile.max_running:
                req = self.waiting.popleft()
                if not req.cancelled:
                    new.append(req)
            if new:
                # sglang runs a prefill batch on its own; it yields each request's first token
                await self._advance(self.sampler.prefill_ms(sum(r.prompt_tokens for r in new)))
                for r in new:
                    self._emit(r, 1)
                self.running.extend(new)
                continue
            batch = len(self.running)
            ms = self.sampler.step_ms(batch)
            await self._advance(ms)
            produced = stepped = 0
            for r in self.running:
                if r.remaining > 0 and not r.cancelled:
                    if r.acceptance is None and self.sampler.profile.speculative:
                        r.acceptance = self.sampler.acceptance(r.token_ids)
                    n = self.sampler.accepted(r.remaining, r.acceptance)
                    r.accept_steps += 1
                    produced += n
                    stepped += 1
                    self._emit(r, n)
            for s in (self.stats, self.totals):
                s.decode_steps += 1
                s.request_steps += stepped
                s.accept_tokens += produced
            self.last_gen_throughput = produced * 1000.0 * self.speed / ms

    def _emit(self, req: SimRequest, n: int) -> None:
        # sglang's tokenizer_manager.last_receive_tstamp: what /health looks at
        self.last_output = time.time()
        req.emitted += n
        req.out.put_nowait(n)

    @property
    def avg_accept_length(self) -> float:
        s = self.totals
        return s.accept_tokens / s.request_steps if s.request_steps else 0.0
