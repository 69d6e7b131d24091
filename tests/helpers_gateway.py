"""The real gateway for tests: smg installed from the committed hash lock into a venv under pytest's
temp dir (never the user's cache), run as a child process; one streamed request. The streaming client that
counts failures is stackbuild's own (gate/background.py), the demos' client."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from stackbuild.effects import proc
from stackbuild.effects.gateway import Gateway as GatewayApi
from stackbuild.effects.net import free_port
from stackbuild.gate.background import BackgroundLoad
from stackbuild.paths import shipped_dir
from stackbuild.render.gateway import KEY_VAR, LAUNCHER, launcher_argv
from stackbuild.spec.gateway import Gateway, HealthCheck
from stackbuild.spec.load import load_stack
from stackbuild.spec.lock.smg import gateway_target, lock_path

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
    """`smg launch` as the rendered unit runs it (the same launcher and argv, the venv's python for the
    image's), given a control-plane key of its own in its environment as the unit's --env-file gives it,
    in a child process; always stopped. `env`: the data-plane keys' values, the same way."""

    def __init__(self, smg: Path, gw: Gateway, workers: list[str], log: Path, env: dict[str, str] | None = None
                 ) -> None:
        self.gw, self.url, self.log = gw, f"http://127.0.0.1:{gw.port}", log
        self.key = secrets.token_hex(32)
        argv = launcher_argv(gw, workers, python=str(smg.parent / "python"),
                             launcher=str(ROOT / "templates" / LAUNCHER))
        with log.open("wb") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                         env={**os.environ, KEY_VAR: self.key, **(env or {})})

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
def smg_running(smg: Path, gw: Gateway, workers: list[str], log: Path, env: dict[str, str] | None = None
                ) -> Iterator[SmgProc]:
    p = SmgProc(smg, gw, workers, log, env)
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


DEMO_DONE = "demo: through the gateway during the rollouts: "


@dataclass
class DemoRun:
    code: int
    out: str
    load: BackgroundLoad | None  # the independent client, once the demo printed its gateway


def demo_with_client(argv: list[str], cwd: Path, timeout_s: float) -> DemoRun:
    """Run a demo; as soon as it prints `gateway: URL`, an independent client of the test's own streams
    completions through that URL, 4 at a time, until the demo says its rollouts are over (bounded: the demo is killed
    at `timeout_s`)."""
    p = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    load: BackgroundLoad | None = None
    timer = threading.Timer(timeout_s, p.kill)
    timer.start()
    try:
        assert p.stdout is not None
        for line in p.stdout:
            lines.append(line)
            if load is None and line.startswith("gateway: http://"):
                # the rate issue 29 saw 4 HTTP 500s of 15113 at: small completions, 4 at a time
                load = BackgroundLoad(line.split(" ", 1)[1].strip(), clients=4, pause_s=0.05).__enter__()
            elif load is not None and line.startswith(DEMO_DONE):  # the rollouts are over: the host goes next
                load.stop()
        code = p.wait()
    finally:
        timer.cancel()
        if load is not None:
            load.stop()
        if p.poll() is None:
            p.kill()
            p.wait()
    return DemoRun(code, "".join(lines), load)
