"""Does a fleet wave run its hosts in parallel? One host's deploy vs a 3-host wave, one run.

Three local systemd+sshd hosts get the sim stack's baseline; then the same kind
of candidate (another --seed: same cost, a real gate) is deployed to one host
alone, then to a wave of three through the fleet's own wave runner
(stackbuild.fleet.rollout.each over RealOps.deploy: the single-host flow per host,
in threads). A ratio near 1 means the wave costs what one host costs; 3 would be
serial. This machine has 2 cores shared with the simulators and the gate
clients, so the ratio here is an upper bound of what separate hosts would show.

Needs the local infrastructure (bash scripts/infra/up.sh). Usage:
    python bench/fleet_parallel.py [--hosts 3]
Last line: fleet_parallel: one_host_s=A wave_s=B hosts=N ratio=C
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from _local import sim_image

from stackbuild.effects.net import free_port
from stackbuild.fleet.rollout import each
from stackbuild.flows.deploy_host import RunOptions
from stackbuild.flows.rollout_ops import RealOps
from stackbuild.host import local
from stackbuild.host.ssh import SshOptions
from stackbuild.spec.fleet import FleetHost
from stackbuild.spec.load import load_stack

SPEC = """\
name: fleetbench
base_image: local/debian:bookworm
cuda: null
python: "3.11"
build: {secrets: [hf_token]}
server:
  engine: sim
  model_path: sim/model
  flags: {--speed: 10, --warmup-s: 0.3}
runtime: {gpus: none, tp: 1, ulimits: {}, start_timeout_s: 15, ready_timeout_s: 10}
gate:
  default_profile: tiny
  profiles:
    tiny: {concurrency: [4], input_len: 16, output_len: 96, warmup: 1, runs: 3, max_runs: 6, tolerance: 0.2}
host: {service: fleetbench, strategy: swap}
variants:
  seed1: {server: {flags: {--seed: 1}}}
  seed2: {server: {flags: {--seed: 2}}}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", type=int, default=3)
    n = ap.parse_args().hosts
    image = sim_image()
    with tempfile.TemporaryDirectory(prefix="fleetbench-") as tmp:
        root = Path(tmp)
        (root / "stacks").mkdir()
        (root / "stacks" / "fleetbench.yaml").write_text(SPEC)
        hosts: list[local.LocalHost] = []
        known = ""
        try:
            for i in range(n):
                h = local.start(root / "keys", name=f"fleetbench-{i}-{free_port()}")
                hosts.append(h)
                known += h.known_hosts.read_text()
            (root / "known_hosts").write_text(known)
            ssh = SshOptions(known_hosts=root / "known_hosts", key_filename=str(hosts[0].key))
            inv = {f"h{i}": FleetHost(name=f"h{i}", address=h.target, port=free_port(),
                                      service=f"fleetbench{i}") for i, h in enumerate(hosts)}
            names = list(inv)

            def ops(variant: str | None) -> RealOps:
                run = RunOptions(stack=load_stack("fleetbench", root=root, variant=variant), ssh=ssh,
                                 ledger=root / "ledger.db", root=root)
                return RealOps(run=run, hosts=inv, image=image, echo=lambda s: None)

            setup = each(names, ops(None).deploy, n)  # baseline everywhere (not timed)
            assert all(getattr(r, "outcome", None) == "promoted" for r in setup.values()), setup
            t0 = time.monotonic()
            one = ops("seed1").deploy(names[0])
            one_s = time.monotonic() - t0
            t0 = time.monotonic()
            wave = each(names, ops("seed2").deploy, n)
            wave_s = time.monotonic() - t0
            outcomes = [one.outcome] + [getattr(r, "outcome", repr(r)) for r in wave.values()]
            print(f"outcomes: {outcomes}")
            if outcomes != ["promoted"] * (n + 1):  # a rollback's time is not a deploy's: no figure
                raise SystemExit(f"not every candidate was promoted: {outcomes}")
            print(f"fleet_parallel: one_host_s={one_s:.2f} wave_s={wave_s:.2f} hosts={n} ratio={wave_s / one_s:.2f}")
        finally:
            for i, h in enumerate(hosts):
                local.stop(h, (f"fleetbench{i}",))


if __name__ == "__main__":
    main()
