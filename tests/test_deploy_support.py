"""Fixtures and helpers for the deploy integration tests (real sshd+systemd host, registry).

Kept in one importable module so each scenario test stays a few lines.
It provides its own test host and sim image so the deploy tests run even
before (or without) shared fixtures in conftest.py.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from stackbuild.effects.net import free_port
from stackbuild.host.local import LocalHost

REGISTRY = "127.0.0.1:5000"
TESTHOST_IMAGE = os.environ.get("STACKBUILD_TESTHOST_IMAGE", "local/stackbuild-testhost:bookworm")
DOCKER = "/usr/bin/docker"
POLL_S = 0.1  # HostBox.until: how often the host checks a condition
REPO_ROOT = Path(__file__).resolve().parents[1]


def docker(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DOCKER, *args], capture_output=True, text=True, check=check,
                          timeout=timeout)


@dataclass(frozen=True)
class HostBox(LocalHost):
    """The local host as the deploy tests use it: out-of-band inspection and CLI args."""

    def sh(self, script: str, check: bool = False) -> subprocess.CompletedProcess[str]:
        """Inspect the host out of band (docker exec), never through the deploy's SSH."""
        return docker("exec", self.container, "sh", "-c", script, check=check, timeout=60)

    def until(self, condition: str, timeout_s: float, *, unless: subprocess.Popen[Any] | None = None) -> bool:
        """Wait until the shell `condition` holds on the host: one `docker exec` whose shell polls it there
        every 0.1 s. A poll through `docker exec` each time costs ~85 ms of CPU a call (docker, dockerd,
        containerd, runc): a test polling two of them every 0.1 s beside a rollout took 0.5 of a CPU.
        False once `timeout_s` passed, or once `unless` (the process whose progress is awaited) ended."""
        tries = max(1, math.ceil(timeout_s / POLL_S))  # the shell's own bound: a killed `docker exec` leaves it
        script = (f"n=0; until {condition}; do n=$((n+1)); [ $n -lt {tries} ] || exit 1; sleep {POLL_S}; done")
        w = subprocess.Popen([DOCKER, "exec", self.container, "sh", "-c", script],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        try:
            while w.poll() is None:
                if (unless is not None and unless.poll() is not None) or time.monotonic() > deadline:
                    return False
                time.sleep(0.05)
            return w.returncode == 0
        finally:
            if w.poll() is None:
                w.kill()
            w.wait()

    def ssh_args(self) -> list[str]:
        return ["--host", self.target, "--known-hosts", str(self.known_hosts),
                "--identity", str(self.key)]


def pending_on(service: str) -> str:
    """A shell condition for HostBox.until: the host's state marks a deploy of `service` under way (its state
    file, as stackbuild.host.state writes it: indented JSON, `"pending": null` when none is)."""
    return f"grep -q '^  \"pending\": {{' /var/lib/stackbuild/{service}/state.json"


def need_infra() -> None:
    """In CI a missing daemon is a failure; on a dev box without it, say what to run."""
    ok = shutil.which(DOCKER) and docker("info", check=False, timeout=20).returncode == 0
    if not ok:
        msg = "dockerd is not running: run `bash scripts/infra/up.sh`"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    if docker("image", "inspect", TESTHOST_IMAGE, check=False).returncode != 0:
        pytest.fail(f"{TESTHOST_IMAGE} missing: run `bash scripts/infra/up.sh`")


@pytest.fixture(scope="session")
def deploy_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostBox]:
    from stackbuild.host import local

    need_infra()
    lh = local.start(tmp_path_factory.mktemp("deployhost"), image=TESTHOST_IMAGE)
    try:
        yield HostBox(lh.container, lh.port, lh.key, lh.known_hosts)
    finally:
        local.stop(lh)


@dataclass(frozen=True)
class SimImage:
    ref: str  # pinned REPO@sha256:...
    digest: str


@pytest.fixture(scope="session")
def sim_image() -> SimImage:
    need_infra()
    return _built_image()


def _built_image() -> SimImage:
    from stackbuild.image.build import build_stack
    from stackbuild.spec.load import load_stack

    # The shipped sim stack's image: the same Dockerfile the simtest spec renders
    # (the sim engine's image does not depend on server flags).
    stack = load_stack("sim", root=REPO_ROOT)
    built = build_stack(stack, registry=f"{REGISTRY}/stackbuild", push=True, root=REPO_ROOT)
    from stackbuild.image.ref import pin

    assert built.digest
    return SimImage(pin(built.image, built.digest), built.digest)


SPEC = """\
name: simtest
description: deploy integration tests (sim at high speed, tiny gate)
base_image: local/debian:bookworm
cuda: null
python: "3.11"
build:
  secrets: [hf_token]
server:
  engine: sim
  model_path: sim/model
  flags:
    --speed: 4
    --warmup-s: 0.3
runtime:
  gpus: none
  tp: 1
  port: {port}
  staging_port: {staging}
  ulimits: {{}}
  start_timeout_s: 60
  ready_timeout_s: 60
  restart: on-failure
gate:
  default_profile: tiny
  profiles:
    # one level, runs of ~0.7 s (3 rounds of 4 requests at --speed 4): the simulator's steps
    # (~3 ms) stay longer than its CPU work, so a busy machine barely moves a run (measured
    # under 4 busy loops: 1.4% run to run, where --speed 10 with one 0.14 s round gave 5.5%
    # and far more under the whole suite), short enough for seconds per deploy
    tiny:
      concurrency: [4]
      input_len: 16
      output_len: 64
      min_requests: 12
      warmup: 1
      runs: 3
      # looks start where a boundary can be crossed (correlation allowed for): room past them on a busy machine
      max_runs: 10
      # the deploy flow, not the gate's precision, is under test here (test_gate_sim.py holds that).
      # The builds it compares run at 1x (equal) and 0.25x ("slower"); the bar sits midway between
      # them on the log scale the gate decides on (0.5), the most room for both: a swap measures its
      # two sides seconds apart, and a fresh-clone CI read an equal build at 0.76x, CI -45%..+6%,
      # its incumbent quiet (1046-1099 tok/s) and its candidate under other tests' load (537-1068)
      tolerance: 0.5
      timeout_s: 20
      # the token-id part of the output agreement only, on 4 prompts: the flow is under test, and
      # tests/test_gate_agreement_live.py holds the agreement over HTTP (the 52 prompts a side of
      # the default took ~2 s of each gate, ~60 gates a run)
      agreement_prompts: 4
      agreement_long_prompts: 0
      agreement_text_prompts: 0
host:
  service: {service}
  strategy: swap
  channel: {service}
variants:
  good2: {{server: {{flags: {{--seed: 1}}}}}}
  slower: {{server: {{flags: {{--speed: 1}}}}}}
  crash: {{server: {{flags: {{--fault: crash-on-start}}}}}}
  neverready: {{server: {{flags: {{--fault: never-ready}}}}, runtime: {{ready_timeout_s: 3}}}}
  badgen: {{server: {{flags: {{--fault: fail-first-generation}}}}}}
  garbage: {{server: {{flags: {{--fault: garbage}}}}}}
  badflag: {{server: {{flags: {{--no-such-flag: 1}}}}}}
  slowload: {{server: {{flags: {{--load-s: 5}}}}}}
  needgpu: {{runtime: {{gpus: 1}}}}
  # claims FlashInfer's trtllm all-reduce at TP 8; the simulator, like sglang 0.5.23 on cards without
  # multicast, logs the failed workspace preflight (and runs NCCL)
  trtllm:
    runtime: {{tp: 8}}
    server:
      flags: {{--tp-size: 8, --flashinfer-allreduce-fusion-backend: auto}}
      env: {{SGLANG_ENABLE_PCIE_IPC_ALLREDUCE: "0"}}
      expect_log:
        absent:
          - {{text: "FlashInfer workspace preflight probe failed",
             source: "sglang 0.5.23 srt/layers/flashinfer_comm_fusion.py:368"}}
"""


@dataclass
class Project:
    root: Path
    host: HostBox
    image: SimImage
    service: str
    port: int
    staging: int
    ledger: Path

    def cmd(self, *args: str, image: str | None = None) -> list[str]:
        verb, *rest = args
        extra = [] if verb != "deploy" else ["--ledger", str(self.ledger)]
        if verb == "deploy" and image != "":  # "" = let deploy build and push the stack
            extra += ["--image", image or self.image.ref]
        return [sys.executable, "-m", "stackbuild", "--root", str(self.root), verb, *rest,
                *self.host.ssh_args(), *extra]

    def run(self, *args: str, image: str | None = None, timeout: float = 600
            ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.cmd(*args, image=image), capture_output=True, text=True,
                              timeout=timeout, cwd=self.root)

    def deploy(self, variant: str | None = None, *extra: str, image: str | None = None
               ) -> subprocess.CompletedProcess[str]:
        args = ["deploy", "simtest", *(["--variant", variant] if variant else []), *extra]
        return self.run(*args, image=image)

    def popen(self, variant: str | None, *extra: str) -> subprocess.Popen[str]:
        args = ["deploy", "simtest", *(["--variant", variant] if variant else []), *extra]
        return subprocess.Popen(self.cmd(*args), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, cwd=self.root)

    # --- what the host looks like, read out of band ---------------------------------
    def state(self) -> dict[str, object]:
        out = self.host.sh(f"cat /var/lib/stackbuild/{self.service}/state.json").stdout
        return json.loads(out) if out.strip() else {}

    def unit_text(self, unit: str | None = None) -> str:
        return self.host.sh(f"cat /etc/systemd/system/{unit or self.service}.service").stdout

    def active(self, unit: str | None = None) -> str:
        return self.host.sh(f"systemctl is-active {unit or self.service}").stdout.strip()

    def serving(self, port: int | None = None) -> bool:
        return generate(port or self.port)

    def snapshot(self) -> tuple[str, str, str]:
        """State file bytes, main unit text, candidate unit presence: 'nothing changed' means equal."""
        st = self.host.sh(f"cat /var/lib/stackbuild/{self.service}/state.json").stdout
        cand = self.host.sh(f"ls /run/systemd/system/{self.service}-candidate.service "
                            f"/etc/systemd/system/{self.service}-candidate.service").returncode
        return st, self.unit_text(), str(cand)


def generate(port: int, timeout: float = 5.0) -> bool:
    body = json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 4}}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status == 200 and bool(json.loads(r.read()).get("text"))
    except (OSError, ValueError):
        return False


def health(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2.0) as r:
            return r.status == 200
    except (OSError, ValueError):
        return False


@dataclass
class Client:
    """Keeps sending small generations to one port; records every outcome with its time."""

    port: int
    # "generate": real work (side-by-side: it must only ever reach the incumbent);
    # "health": swap, where the candidate takes the port and a client's generation
    # would consume a fault meant for the deploy's own first-generation probe
    kind: str = "generate"
    interval_s: float = 0.05
    max_requests: int = 4000
    max_seconds: float = 120.0
    results: list[tuple[float, bool]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Client:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        t0 = time.monotonic()
        while not self._stop.is_set() and len(self.results) < self.max_requests \
                and time.monotonic() - t0 < self.max_seconds:
            ok = generate(self.port, timeout=2.0) if self.kind == "generate" else \
                health(self.port)
            self.results.append((time.monotonic(), ok))
            # paced: a tight loop would steal the shared cores from the gate it watches
            time.sleep(self.interval_s)

    @property
    def failed(self) -> int:
        return sum(1 for _, ok in self.results if not ok)

    def downtime(self) -> float:
        """Seconds from the first failure after a success to the next success, summed."""
        total, down_since, last_ok = 0.0, None, None
        for t, ok in self.results:
            if not ok and down_since is None and last_ok is not None:
                down_since = last_ok
            if ok:
                if down_since is not None:
                    total += t - down_since
                    down_since = None
                last_ok = t
        return total


def make_project(host: HostBox, image: SimImage, root: Path, extra_variants: str = "") -> Project:
    service = f"sbt{secrets.token_hex(3)}"
    port, staging = free_port(), free_port()
    (root / "stacks").mkdir(parents=True, exist_ok=True)
    text = SPEC.format(port=port, staging=staging, service=service)
    (root / "stacks" / "simtest.yaml").write_text(text + extra_variants)
    return Project(root, host, image, service, port, staging, root / "ledger.db")


@contextmanager
def running_project(host: HostBox, image: SimImage, root: Path, variants: str = "", *,
                    deployed: bool = False) -> Iterator[Project]:
    """A project on the shared host for one test module; `deployed`: with a good incumbent serving."""
    p = make_project(host, image, root, variants)
    try:
        if deployed:
            r = p.deploy()
            assert r.returncode == 0, r.stdout + r.stderr
        yield p
    finally:
        cleanup_project(p)


def project_fixture(name: str, variants: str = "", *, deployed: bool = False) -> Any:
    """A module's `project` fixture: `project = project_fixture("name")` in the test module,
    which also imports the `deploy_host` and `sim_image` fixtures it asks for."""

    @pytest.fixture(scope="module")
    def project(deploy_host: HostBox, sim_image: SimImage,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
        with running_project(deploy_host, sim_image, tmp_path_factory.mktemp(name), variants,
                             deployed=deployed) as p:
            yield p

    return project


def ensure_incumbent(p: Project) -> dict[str, object]:
    """A good incumbent serving before a scenario (deployed once, then reused)."""
    st = p.state()
    cur = st.get("current") if st else None
    if not (cur and p.active() == "active" and p.serving()):
        r = p.deploy()
        assert r.returncode == 0, r.stdout + r.stderr
        st = p.state()
    assert st["current"] and not st.get("pending")
    return st


def assert_incumbent_unchanged(p: Project, before: dict[str, object]) -> None:
    after = p.state()
    assert after["current"] == before["current"], "the incumbent release changed"
    assert after.get("pending") is None
    assert p.active() == "active"
    assert p.serving(), "the incumbent does not serve after the failed deploy"
    for d in ("/run/systemd/system", "/etc/systemd/system"):
        assert p.host.sh(f"test -e {d}/{p.service}-candidate.service").returncode != 0
    assert p.host.sh(f"test -e /run/systemd/system.control/{p.service}.service").returncode != 0  # no override
    assert p.host.sh(f"systemctl is-enabled {p.service}").stdout.strip() == "enabled"
    assert p.host.sh(f"test -d /var/lib/stackbuild/{p.service}/lock").returncode != 0


def cleanup_project(p: Project) -> None:
    for unit in (p.service, f"{p.service}-candidate"):
        p.host.sh(f"systemctl stop {unit}")
        docker("rm", "-f", unit, check=False)


# One dict per figure the deploy tests measured; conftest.py prints them at the end of the run
# (an xdist worker sends its own to the controller).
FIGURES: list[dict[str, object]] = []


def reported_downtime(stdout: str) -> float | None:
    """The incumbent downtime a deploy printed (`downtime: 1.06s in ...`), if it printed one."""
    for line in stdout.splitlines():
        if line.strip().startswith("downtime:"):
            return float(line.split()[1].rstrip("s"))
    return None


def record_figure(**kw: object) -> None:
    FIGURES.append(kw)
