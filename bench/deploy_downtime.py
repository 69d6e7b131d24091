"""The incumbent's downtime per deploy outcome, swap and side-by-side, on a real local host.

On one local systemd+sshd host the sim stack's baseline is deployed, then, each a real
`stackbuild deploy` (the CLI, a subprocess) of a candidate with one fault, under swap:
a passing candidate (promoted), crash on start, never ready (ready timeout 3 s), a failed
first generation, garbage output (the gate's probe), slower (the gate), stalled streams
(stall timeout 1 s); then under side-by-side a slower candidate (rejected) and a passing
one (promoted through the switch). "reported" is the downtime the deploy printed (from the
incumbent's stop to a server serving again); "client" is a prober hitting the service port
every 50 ms (`/health` under swap, where a client's generation would consume the fault meant
for the deploy's own first-generation probe; a small `/generate` under side-by-side), summed
from the last success before each failure to the next success. The simulator runs at
--speed 4 with the deploy tests' `tiny` profile; one run per outcome.

Needs the local infrastructure (bash scripts/infra/up.sh). Usage:
    python bench/deploy_downtime.py
Last line: deploy_downtime: promote_s=A crash_s=B ... (reported seconds; sbs_* from the client)
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from _local import deploy, sim_image

from stackbuild.effects.net import free_port
from stackbuild.host import local

SPEC = """\
name: downbench
base_image: local/debian:bookworm
cuda: null
python: "3.11"
build: {{secrets: [hf_token]}}
server:
  engine: sim
  model_path: sim/model
  flags: {{--speed: 4, --warmup-s: 0.3}}
runtime: {{gpus: none, tp: 1, ulimits: {{}}, port: {port}, staging_port: {staging}, start_timeout_s: 15,
           ready_timeout_s: 10, restart: on-failure}}
gate:
  default_profile: tiny
  profiles:
    tiny: {{concurrency: [4], input_len: 16, output_len: 64, min_requests: 12, warmup: 1, runs: 3, max_runs: 6,
            tolerance: 0.2, timeout_s: 20}}
host: {{service: {service}, strategy: swap}}
variants:
  good1: {{server: {{flags: {{--seed: 1}}}}}}
  good2: {{server: {{flags: {{--seed: 2}}}}}}
  slower: {{server: {{flags: {{--speed: 2}}}}}}
  crash: {{server: {{flags: {{--fault: crash-on-start}}}}}}
  neverready: {{server: {{flags: {{--fault: never-ready}}}}, runtime: {{ready_timeout_s: 3}}}}
  badgen: {{server: {{flags: {{--fault: fail-first-generation}}}}}}
  garbage: {{server: {{flags: {{--fault: garbage}}}}}}
  stall: {{server: {{flags: {{--fault: stall-stream}}}}, gate: {{profiles: {{tiny: {{stall_timeout_s: 1}}}}}}}}
"""
# (key in the summary, variant, strategy, what the table calls it, the exit code it must give)
CASES = (
    ("promote", "good1", "swap", "promote (no fault)", 0),
    ("crash", "crash", "swap", "crash on start", 1),
    ("never_ready", "neverready", "swap", "never ready (ready timeout 3 s)", 1),
    ("bad_generation", "badgen", "swap", "fails first generation", 1),
    ("garbage", "garbage", "swap", "garbage output (gate probe)", 1),
    ("slower", "slower", "swap", "slower (gate)", 1),
    ("stall", "stall", "swap", "stalled stream (stall timeout 1 s)", 1),
    ("sbs_reject", "slower", "side-by-side", "side-by-side, slower: rejected", 1),
    ("sbs_switch", "good2", "side-by-side", "side-by-side, promoted: the switch", 0),
)


def health(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2.0) as r:
            return bool(r.status == 200)
    except (OSError, ValueError):
        return False


def generate(port: int) -> bool:
    body = json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 4}}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/generate", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=2.0) as r:
            return bool(r.status == 200 and json.loads(r.read()).get("text"))
    except (OSError, ValueError):
        return False


@dataclass
class Prober:
    """Probes one port every 50 ms in a thread; records (time, ok)."""

    port: int
    probe: str  # "health" | "generate"
    results: list[tuple[float, bool]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> Prober:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        check = health if self.probe == "health" else generate
        while not self._stop.is_set():
            self.results.append((time.monotonic(), check(self.port)))
            time.sleep(0.05)  # paced: a tight loop would steal the shared cores from the gate

    @property
    def failed(self) -> int:
        return sum(1 for _, ok in self.results if not ok)

    def downtime(self) -> float:
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


def reported(out: str) -> float | None:
    m = re.search(r"^\s*downtime: ([0-9.]+)s", out, re.M)
    return float(m[1]) if m else None


def main() -> int:
    image = sim_image()
    summary: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="downbench-") as tmp:
        root = Path(tmp)
        service, port = f"downbench{free_port()}", free_port()
        (root / "stacks").mkdir()
        (root / "stacks" / "downbench.yaml").write_text(SPEC.format(port=port, staging=free_port(), service=service))
        host = local.start(root / "keys", name=f"{service}-host")
        try:
            first = deploy(root, "downbench", host, image)
            assert first.returncode == 0, first.stdout + first.stderr
            print(f"{'outcome':38} {'exit':>4} {'reported':>9} {'client':>7} {'failed':>10}")
            for key, variant, strategy, what, want in CASES:
                with Prober(port, "health" if strategy == "swap" else "generate") as p:
                    r = deploy(root, "downbench", host, image, "--variant", variant, "--strategy", strategy)
                out = r.stdout + r.stderr
                if r.returncode != want:
                    raise SystemExit(f"{what}: exit {r.returncode}, expected {want}\n{out[-3000:]}")
                rep = reported(out)
                shown = f"{rep:8.2f}s" if rep is not None else f"{'-':>9}"
                print(f"{what:38} {r.returncode:4d} {shown} {p.downtime():6.2f}s {p.failed:4d} of {len(p.results):<4d}",
                      flush=True)
                if strategy == "swap":
                    summary[f"{key}_s"] = f"{rep:.2f}" if rep is not None else "-"
                else:
                    summary[f"{key}_s"] = f"{p.downtime():.2f}"
                    summary[f"{key}_failed"] = str(p.failed)
        finally:
            local.stop(host, (service,))
    print("deploy_downtime: " + " ".join(f"{k}={v}" for k, v in summary.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
