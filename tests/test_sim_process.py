"""The simulator as a real process over real HTTP: lifecycle, API shapes, faults.

Also home of `SimProc`, the launcher the gate tests and bench/gate_accuracy.py use.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from builder.errors import InfraError
from builder.gate.readiness import wait_ready


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class SimProc:
    """`stackbuild sim` in a child process on a free loopback port; always stopped."""

    def __init__(self, *args: str, warmup_s: float = 0.2) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # closed in stop(): the log outlives this method
        self.log = tempfile.NamedTemporaryFile(prefix="sim-", suffix=".log", delete=False)  # noqa: SIM115
        argv = [sys.executable, "-m", "builder", "sim", "--port", str(self.port),
                "--warmup-s", str(warmup_s), *args]
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_port(self, timeout: float = 15.0) -> SimProc:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sim exited {self.proc.returncode}: {self.output()}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port),
                                                                        0.2):
                return self
            time.sleep(0.05)
        raise RuntimeError(f"sim did not listen within {timeout}s: {self.output()}")

    def wait_up(self, timeout: float = 15.0) -> SimProc:
        wait_ready(self.url, timeout)
        return self

    def output(self) -> str:
        with open(self.log.name, encoding="utf-8", errors="replace") as f:
            return f.read()[-2000:]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()
        os.unlink(self.log.name)
        return int(self.proc.returncode)


@contextlib.contextmanager
def sim(*args: str, up: bool = True, warmup_s: float = 0.2) -> Iterator[SimProc]:
    s = SimProc(*args, warmup_s=warmup_s)
    try:
        s.wait_port()
        if up:
            s.wait_up()
        yield s
    finally:
        s.stop()


def http(url: str, body: Any = None, method: str | None = None) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def sse(raw: bytes) -> list[Any]:
    events = [e[6:] for e in raw.decode().split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


pytestmark = pytest.mark.integration


def test_lifecycle_warmup_then_ready_then_sigterm() -> None:
    s = SimProc("--speed", "20", warmup_s=1.5).wait_port()
    try:
        assert http(s.url + "/health")[0] == 503
        assert http(s.url + "/health_generate")[0] == 503
        assert http(s.url + "/ready")[0] == 503
        assert http(s.url + "/v1/models")[0] == 200  # answers during warmup, like sglang
        # sglang 0.5.23 http_server.py:933-939: /generate has no startup check; it serves
        assert http(s.url + "/generate", {"text": "x"})[0] == 200
        s.wait_up(10)
        assert http(s.url + "/health")[0] == 200
        assert http(s.url + "/ready")[0] == 200
    finally:
        rc = s.stop()
    assert rc == 0


def test_streaming_shapes_and_usage() -> None:
    with sim("--speed", "50", "--profile", "eagle3-topk1-v2", "--served-model-name", "m1",
             "--enable-metrics") as s:
        assert http(s.url + "/sim/stats/reset", {}, method="POST")[0] == 200
        status, raw = http(s.url + "/v1/completions", {
            "prompt": [11, 12, 13], "max_tokens": 20, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}})
        assert status == 200
        chunks = sse(raw)
        assert chunks[-1]["choices"] == []
        assert chunks[-1]["usage"]["completion_tokens"] == 20
        assert chunks[-1]["usage"]["prompt_tokens"] == 3
        assert chunks[-2]["choices"][0]["finish_reason"] == "length"
        assert all(c["object"] == "text_completion" and c["model"] == "m1" for c in chunks)
        streamed = "".join(c["choices"][0]["text"] for c in chunks[:-1])
        # speculative steps put several tokens in one chunk
        assert len(chunks) - 1 < 20

        status, raw = http(s.url + "/v1/completions", {
            "prompt": [11, 12, 13], "max_tokens": 20, "temperature": 0, "ignore_eos": True})
        whole = json.loads(raw)
        assert whole["choices"][0]["text"] == streamed  # greedy is deterministic
        assert whole["usage"] == {"prompt_tokens": 3, "completion_tokens": 20,
                                  "total_tokens": 23, "prompt_tokens_details": None}

        status, raw = http(s.url + "/generate", {
            "input_ids": [11, 12, 13], "stream": True,
            "sampling_params": {"max_new_tokens": 20, "temperature": 0, "ignore_eos": True}})
        gen = sse(raw)
        last = gen[-1]
        assert last["text"] == streamed and len(last["output_ids"]) == 20
        meta = last["meta_info"]
        assert meta["completion_tokens"] == 20 and meta["prompt_tokens"] == 3
        assert meta["finish_reason"] == {"type": "length", "length": 20}
        assert meta["spec_accept_length"] > 1.0
        counts = [c["meta_info"]["completion_tokens"] for c in gen]
        assert counts == sorted(counts) and counts[0] == 1

        status, raw = http(s.url + "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True})
        chat = sse(raw)
        assert chat[0]["object"] == "chat.completion.chunk"
        assert chat[0]["choices"][0]["delta"]["role"] == "assistant"

        assert http(s.url + "/v1/completions", {"prompt": {"x": 1}})[0] == 400
        info = json.loads(http(s.url + "/server_info")[1])
        assert info["speculative_algorithm"] == "EAGLE3"
        assert info["max_running_requests"] == 48
        assert info["internal_states"][0]["avg_spec_accept_length"] > 1.0
        models = json.loads(http(s.url + "/v1/models")[1])
        assert models["data"][0]["id"] == "m1"
        metrics = http(s.url + "/metrics")[1].decode()
        for name in ("sglang:num_running_reqs", "sglang:gen_throughput",
                     "sglang:spec_accept_length", "sglang:generation_tokens_total",
                     "sglang:time_to_first_token_seconds_bucket"):
            assert f'{name}{{model_name="m1",engine_type="unified"' in metrics
        stats = json.loads(http(s.url + "/sim/stats")[1])
        assert stats["output_tokens"] == 65 and stats["requests"] == 4


def test_crash_on_start_never_listens() -> None:
    s = SimProc("--fault", "crash-on-start")
    try:
        assert s.proc.wait(10) == 1
        assert "crash-on-start" in s.output()
    finally:
        s.stop()


def test_never_ready_reports_the_health_layer() -> None:
    with sim("--fault", "never-ready", up=False) as s, pytest.raises(InfraError, match="layer 'health'"):
        wait_ready(s.url, 1.0)


def test_unreachable_reports_the_port_layer() -> None:
    with pytest.raises(InfraError, match="layer 'port'"):
        wait_ready(f"http://127.0.0.1:{free_port()}", 0.5)


def test_fail_first_generation_then_serves() -> None:
    with sim("--fault", "fail-first-generation", "--speed", "50", up=False) as s:
        time.sleep(0.4)
        body = {"prompt": "a", "max_tokens": 3}
        assert http(s.url + "/v1/completions", body)[0] == 500
        assert http(s.url + "/v1/completions", body)[0] == 200


def test_max_running_requests_caps_the_batch_and_queues_the_rest() -> None:
    from concurrent.futures import ThreadPoolExecutor

    with sim("--profile", "eagle3-topk1-v2", "--max-running-requests", "4", "--speed", "5") as s:
        assert json.loads(http(s.url + "/server_info")[1])["max_running_requests"] == 4
        body = {"prompt": [1, 2], "max_tokens": 400, "ignore_eos": True}  # ~1 s each at --speed 5
        with ThreadPoolExecutor(10) as pool:
            futures = [pool.submit(http, s.url + "/v1/completions", body) for _ in range(10)]
            deadline = time.monotonic() + 5
            state: dict[str, Any] = {}
            while time.monotonic() < deadline:
                state = json.loads(http(s.url + "/server_info")[1])["internal_states"][0]
                if state["num_running_reqs"] + state["num_queue_reqs"] == 10:
                    break
                time.sleep(0.05)
            assert (state["num_running_reqs"], state["num_queue_reqs"]) == (4, 6)
            assert [f.result()[0] for f in futures] == [200] * 10
