"""The real gateway for tests: smg installed from the committed hash lock into a venv under pytest's
temp dir (never the user's cache), run as a child process, and a streaming client that counts failures."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from stackbuild.effects import proc
from stackbuild.effects.gateway import Gateway as GatewayApi
from stackbuild.effects.net import free_port
from stackbuild.paths import shipped_dir
from stackbuild.render.gateway import smg_argv
from stackbuild.spec.gateway import Gateway, HealthCheck
from stackbuild.spec.gateway_check import gateway_target, lock_path
from stackbuild.spec.load import load_stack

ROOT = shipped_dir("stacks").parent


def install_smg(tmp: Path) -> Path:
    """The `smg` of the sim stack's gateway lock, installed the way the gateway image installs it."""
    from stackbuild.image.gateway import wheelhouse

    stack = load_stack("sim", root=ROOT)
    assert stack.gateway is not None
    t = gateway_target(stack.gateway)
    assert t is not None
    python = shutil.which(f"python{t.python}")
    assert python, f"python{t.python} (what the gateway lock resolves for) is needed to run the real smg"
    old = os.environ.get("STACKBUILD_CACHE_DIR")
    os.environ["STACKBUILD_CACHE_DIR"] = str(tmp / "cache")  # the wheels land here, not in the user's cache
    try:
        wheelhouse(stack, tmp / "wheels")
    finally:
        if old is None:
            del os.environ["STACKBUILD_CACHE_DIR"]
        else:
            os.environ["STACKBUILD_CACHE_DIR"] = old
    proc.run([python, "-m", "venv", str(tmp / "venv")], what="python -m venv")
    pip = [str(tmp / "venv" / "bin" / "pip"), "install", "--no-cache-dir", "--no-index", "--find-links",
           str(tmp / "wheels"), "--require-hashes", "--no-deps", "--only-binary=:all:", "-r", str(lock_path(stack))]
    proc.run(pip, what="installing smg from its lock", timeout=600)
    return tmp / "venv" / "bin" / "smg"


def loopback_gateway(**overrides: object) -> Gateway:
    """A gateway on free loopback ports, probing its workers every second."""
    fields = {"listen": "127.0.0.1", "port": free_port(), "metrics_port": free_port(), "policy": "round_robin",
              "health": HealthCheck(interval_s=1, timeout_s=3), "shutdown_grace_s": 5, **overrides}
    return Gateway.model_validate(fields)


class SmgProc:
    """`smg launch` as the rendered unit runs it (the same argv), in a child process; always stopped."""

    def __init__(self, smg: Path, gw: Gateway, workers: list[str], log: Path) -> None:
        self.gw, self.url, self.log = gw, f"http://127.0.0.1:{gw.port}", log
        argv = [str(smg), *smg_argv(gw, workers)[1:]]
        with log.open("wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@contextlib.contextmanager
def smg_running(smg: Path, gw: Gateway, workers: list[str], log: Path) -> Iterator[SmgProc]:
    p = SmgProc(smg, gw, workers, log)
    try:
        yield p
    finally:
        p.stop()


def stream_once(url: str, max_tokens: int, timeout: float = 30.0) -> str | None:
    """One streaming /v1/completions; None when it ran to [DONE] with every token, else what went wrong."""
    body = json.dumps({"model": "sim/model", "prompt": "hello", "max_tokens": max_tokens, "stream": True,
                       "stream_options": {"include_usage": True}, "ignore_eos": True, "temperature": 0}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    events: list[dict[str, object]] = []
    done = False
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            for line in r:
                if line.startswith(b"data: [DONE]"):
                    done = True
                elif line.startswith(b"data:"):
                    events.append(json.loads(line[5:]))
    except Exception as err:  # a failed request is data here, whatever the cause
        return f"{type(err).__name__}: {err} after {len(events)} event(s)"
    usage = events[-1].get("usage") if events else None
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    # the server may put several tokens in one event: its own count of what it sent decides
    return None if done and tokens == max_tokens else f"ended with {tokens}/{max_tokens} token(s), done={done}"


@dataclass
class StreamingClient:
    """`clients` threads each sending streaming completions through `url` back to back until stopped."""

    url: str
    clients: int = 3
    max_tokens: int = 32
    max_seconds: float = 120.0
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> StreamingClient:
        self._threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(self.clients)]
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)

    def _loop(self) -> None:
        t0 = time.monotonic()
        while not self._stop.is_set() and time.monotonic() - t0 < self.max_seconds:
            problem = stream_once(self.url, self.max_tokens)
            with self._lock:
                if problem is None:
                    self.ok += 1
                else:
                    self.failures.append(problem)

    @property
    def sent(self) -> int:
        with self._lock:
            return self.ok + len(self.failures)

    def wait_for(self, n: int, timeout: float = 60.0) -> None:
        """Until `n` requests have ended (a paced checkpoint, not a sleep)."""
        deadline = time.monotonic() + timeout
        while self.sent < n:
            assert time.monotonic() < deadline, f"only {self.sent} of {n} requests ended in {timeout}s"
            time.sleep(0.05)


def worker_api_contract(gw: GatewayApi, a: str, b: str, timeout_s: float) -> None:
    """What the fleet's logic may rely on, whichever gateway it talks to: the real one and the fake both
    pass this, starting from a pool of exactly `a`."""
    added = gw.add(b, timeout_s=timeout_s)
    assert (added.url, added.routable) == (b, True)
    assert gw.add(b + "/", timeout_s=timeout_s).id == added.id  # already in: nothing changes
    assert sorted(w.url for w in gw.workers()) == sorted([a, b])
    assert gw.remove(a, timeout_s=timeout_s) is True
    assert gw.remove(a, timeout_s=timeout_s) is False  # out already
    assert [w.url for w in gw.workers() if w.routable] == [b]
    assert gw.add(a, timeout_s=timeout_s).routable  # and back in
    assert sorted(w.url for w in gw.workers() if w.routable) == sorted([a, b])
