"""Clients streaming completions back to back through a URL until stopped, every request counted by its tokens.

The demos' own client sends through the gateway while a release is drained, swapped and put
back, and ends with how many requests it sent and how many failed; the tests run the same
client as an independent one. Each request is the gate's own (`loadgen.stream_request`) with a
text prompt (smg takes no token ids): it counts as answered only when the stream ran to
`data: [DONE]` and the server's usage says every token came (ignore_eos: exactly output_len).
A stream whose server died mid-way ends, through smg, with an error event and then `[DONE]`
(docs/gateway.md, "Retries"): that is a failure here, as is a refused connection or an HTTP error.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field

from stackbuild.effects import http
from stackbuild.gate.loadgen import RequestRecord, new_session, stream_request
from stackbuild.spec.profile import Workload

MAX_FAILURES_KEPT = 20
FAILED_PAUSE_S = 0.2


def served_model(url: str) -> str | None:
    """The first model GET /v1/models lists (smg lists its workers' models), None when it lists none."""
    try:
        reply = http.get(f"{url}/v1/models", timeout=10.0)
        models = reply.json().get("data") or [] if reply.status == 200 else []
    except (http.HttpFailure, ValueError, AttributeError):
        return None
    return str(models[0]["id"]) if models and isinstance(models[0], dict) and "id" in models[0] else None


def prompt_text(client: int, i: int) -> str:
    """A text prompt, distinct per request: smg takes text (or strings), not token ids."""
    return f"Client {client}, request {i}: tell me about the sea."


def failure_of(rec: RequestRecord, want_tokens: int) -> str | None:
    """Why a request failed (None: it was answered in full)."""
    if not rec.ok:
        return rec.error or "failed"
    if rec.output_tokens != want_tokens:
        return f"ended with {rec.output_tokens}/{want_tokens} token(s)"
    return None


@dataclass
class BackgroundLoad:
    """`clients` closed-loop clients on a thread of their own; `with` starts them, leaving the block
    stops them (requests in flight finish, within `workload.timeout_s`)."""

    url: str
    clients: int = 3
    workload: Workload = field(default_factory=lambda: Workload(input_len=16, output_len=32, timeout_s=60.0,
                                                                stall_timeout_s=20.0))
    max_seconds: float = 3600.0  # bounded whatever the caller does
    pause_s: float = 0.0  # between a client's requests: a paced client, not a load test
    ok: int = 0
    failures: list[str] = field(default_factory=list)  # the first MAX_FAILURES_KEPT reasons
    failed: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    def __enter__(self) -> BackgroundLoad:
        if self.workload.model == "default":  # smg routes by model: ask it which one it serves
            self.workload = self.workload.model_copy(update={"model": served_model(self.url) or "default"})
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True,
                                        name="stackbuild-background-load")
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.workload.timeout_s + 10)

    @property
    def sent(self) -> int:
        with self._lock:
            return self.ok + self.failed

    def summary(self) -> str:
        with self._lock:
            why = f" (first: {self.failures[0]})" if self.failures else ""
            return f"{self.ok + self.failed} request(s) sent through {self.url}, {self.failed} failed{why}"

    def wait_for(self, n: int, timeout_s: float) -> bool:
        """Until `n` requests have ended, at most `timeout_s`; whether they did."""
        deadline = time.monotonic() + timeout_s
        while self.sent < n and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.sent >= n

    def _count(self, rec: RequestRecord) -> None:
        why = failure_of(rec, self.workload.output_len)
        with self._lock:
            if why is None:
                self.ok += 1
            else:
                self.failed += 1
                if len(self.failures) < MAX_FAILURES_KEPT:  # when: to find the step of a run that caused it
                    self.failures.append(f"{time.strftime('%H:%M:%S')}: {why}")

    async def _main(self) -> None:
        t0 = time.monotonic()
        async with new_session(self.clients) as session:

            async def client(k: int) -> None:
                i = 0
                while not self._stop.is_set() and time.monotonic() - t0 < self.max_seconds:
                    rec = await stream_request(session, self.url, self.workload, prompt_text(k, i))
                    self._count(rec)
                    i += 1
                    # a refused connection fails at once: do not spin on it
                    await asyncio.sleep(max(self.pause_s, 0.0 if rec.ok else FAILED_PAUSE_S))

            await asyncio.gather(*(client(k) for k in range(self.clients)))
