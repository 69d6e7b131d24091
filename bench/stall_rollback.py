"""How long a stalled candidate holds a host before it is rolled back (issue 23).

On a local systemd+sshd host, the sim stack's baseline is deployed, then a candidate whose
streams stall halfway (`--fault stall-stream`) is deployed under swap with a profile that
allows no failed request: the gate's levels (C=1 and C=8, 3 runs each, 30 s stall bound per
request, the profile defaults) must fail it and the incumbent come back. The figure is the
wall time of that second `stackbuild deploy`, from the command's start to its exit
(rolled back, exit 1). Before the fail-fast every stalled request waited out its bound
(27 requests: 211 s in the issue); now the first one decides its level.

`--code DIR` runs the stackbuild tree at DIR (its CLI, via PYTHONPATH), to measure another
revision on the same machine. Needs the local infrastructure (bash scripts/infra/up.sh).
Usage:
    python bench/stall_rollback.py [--code DIR]
Last line: stall_rollback: deploy_s=X exit=N gate_s=Y code=DIR
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _local import ROOT, deploy, sim_image

from stackbuild.effects.net import free_port
from stackbuild.host import local

SPEC = """\
name: stallbench
base_image: local/debian:bookworm
cuda: null
python: "3.11"
build: {{secrets: [hf_token]}}
server:
  engine: sim
  model_path: sim/model
  flags: {{--speed: 10, --warmup-s: 0.3}}
runtime: {{gpus: none, tp: 1, ulimits: {{}}, port: {port}, staging_port: {staging}, start_timeout_s: 15,
           ready_timeout_s: 10}}
gate:
  default_profile: nofail
  profiles:
    # the profile defaults where they decide the time: C=1,8, 3 runs, 30 s stall bound, no failure allowed
    nofail: {{concurrency: [1, 8], input_len: 16, output_len: 64, runs: 3, max_runs: 3, tolerance: 0.2}}
host: {{service: {service}, strategy: swap}}
variants:
  stall: {{server: {{flags: {{--fault: stall-stream}}}}}}
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", type=Path, default=ROOT, help="the stackbuild tree whose CLI runs the deploys")
    code = ap.parse_args().code.resolve()
    image = sim_image()
    env = {**os.environ, "PYTHONPATH": str(code)}
    with tempfile.TemporaryDirectory(prefix="stallbench-") as tmp:
        root = Path(tmp)
        service = f"stallbench{free_port()}"
        (root / "stacks").mkdir()
        (root / "stacks" / "stallbench.yaml").write_text(SPEC.format(port=free_port(), staging=free_port(),
                                                                      service=service))
        host = local.start(root / "keys", name=f"{service}-host")
        try:
            def run(*extra: str) -> subprocess.CompletedProcess[str]:
                return deploy(root, "stallbench", host, image, *extra, env=env)

            first = run()
            assert first.returncode == 0, first.stdout + first.stderr
            t0 = time.perf_counter()
            r = run("--variant", "stall")
            took = time.perf_counter() - t0
        finally:
            local.stop(host, (service,))
    out = r.stdout + r.stderr
    gate = re.search(r"^\s+(?:ok  |FAIL) gate\s+([0-9.]+)s", out, re.M)
    for line in out.splitlines():
        if line.strip().startswith(("outcome:", "cause:")) or "stalled" in line:
            print(line.strip()[:200])
    print(f"stall_rollback: deploy_s={took:.1f} exit={r.returncode} gate_s={gate[1] if gate else '?'} code={code}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
