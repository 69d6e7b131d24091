"""`stackbuild demo --fleet N`: N local systemd+sshd hosts, the sim stack rolled out as a fleet.

Baseline everywhere, then a failing candidate (stopped at the canary, the rest
untouched), then a passing one through every wave; prints the per-host table. The
stack's gateway (smg) runs on the first host in front of all of them: its URL is
printed once the baseline serves everywhere, and the demo's own client streams
completions through it during the two rollouts, then says how many failed.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from stackbuild.errors import InfraError
from stackbuild.flows.demo_gateway import client, gateway_port, on_port

# (variant, what the demo shows with it, the exit code it must end with)
FLEET_SEQUENCE: tuple[tuple[str | None, str, int], ...] = (
    (None, "the baseline to every host (first deploys: absolute bars)", 0),
    ("slower", "a slower candidate: the canary's gate fails, no other host is touched", 1),
    ("eagle3-topk1-v2", "a better candidate: canary, then every wave, each soaked", 0),
)


# The hosts' simulators run at this --speed, not the stack's 20: at 20 a decode step at C=8 (under 1 ms)
# is shorter than the simulator's own CPU work for it, so a run measures the machine's CPUs, not the
# model (on two cores shared with the test suite a 0.5x build read 0.75x, CI -48%..+15%); at 5 the
# steps outlast that work and the `busy` profile's verdicts are the model's.
FLEET_SPEED = 5


def inventory_text(hosts: list[tuple[str, int, int]]) -> str:
    """hosts: (ssh target, port, staging port); one service name per host (they share this machine)."""
    lines = ["# written by stackbuild demo --fleet", "fleet:", "  waves: [1, '50%', '100%']", "  soak_s: 2",
             "  soak_interval_s: 0.5", "hosts:"]
    for i, (target, port, staging) in enumerate(hosts):
        lines += [f"  - name: h{i}", f"    address: {target}", f"    port: {port}", f"    staging_port: {staging}",
                  f"    service: stackbuild-sim-h{i}", f"    flags: {{--speed: {FLEET_SPEED}}}"]
    return "\n".join(lines) + "\n"


def run_demo_fleet(n: int, root: Path, root_opt: Path | None, image: str, registry: str, ledger: Path,
                   keep: bool, echo: Callable[[str], None], progress: bool = False) -> None:
    from stackbuild.effects.net import free_port
    from stackbuild.flows.fleet_status import latest_rollout, read_fleet, read_gateway, render
    from stackbuild.flows.rollout import FleetArgs, run_fleet
    from stackbuild.host import local
    from stackbuild.host.ssh import SshOptions
    from stackbuild.spec.load import load_stack

    work = root / ".stackbuild" / "demo-fleet"
    hosts: list[local.LocalHost] = []
    known = ""
    codes: list[int] = []
    base = load_stack("sim", root=root_opt)
    port = gateway_port(base)
    during = ExitStack()
    try:
        for i in range(n):
            h = local.start(work, name=f"stackbuild-demo-fleet-{i}")
            hosts.append(h)
            known += h.known_hosts.read_text()  # start() rewrites the file per host: gather them
            echo(f"demo: host h{i}: container {h.container} on {h.target}")
        (work / "fleet_known_hosts").write_text(known)
        inv = work / "inventory.yaml"
        inv.write_text(inventory_text([(h.target, free_port(), free_port()) for h in hosts]))
        ssh = SshOptions(known_hosts=work / "fleet_known_hosts", key_filename=str(hosts[0].key))
        for variant, what, want in FLEET_SEQUENCE:
            echo(f"\n=== deploy sim{' --variant ' + variant if variant else ''} --fleet: {what}")
            stack = on_port(load_stack("sim", root=root_opt, variant=variant), port)
            code = run_fleet(FleetArgs(stack=stack, ssh=ssh, inventory=inv, image=image, registry=registry,
                                       ledger=ledger, root=root, profile_name="busy", progress=progress,
                                       # one host behind the gateway is an outage per rollout: said, then allowed
                                       allow_outage=len(hosts) == 1), echo=echo)
            codes.append(code)
            if code != want:
                raise InfraError(f"demo --fleet: the {variant or 'baseline'} rollout exited {code}, expected {want}; "
                                 "see its table above")
            if len(codes) == 1:  # every host serves the baseline behind the gateway (on h0)
                during.enter_context(client(port, echo))
        during.close()
        echo("\n=== fleet status")
        base = on_port(base, port)
        rows = read_fleet(base, ssh, None, inv)
        echo(render(rows, latest_rollout(ledger, base)))
        for line in read_gateway(base, ssh, None, inv):
            echo(line)
        wrong = [r.host for r in rows if r.release != "sim-eagle3-topk1-v2" or not r.active]
        if wrong:
            raise InfraError(f"demo --fleet: not on the passing candidate: {', '.join(wrong)}")
        echo(f"demo: every host ({n}) runs the passing candidate")
    finally:
        during.close()
        if not keep:
            for i, h in enumerate(hosts):
                local.stop(h, (f"stackbuild-sim-h{i}", *([base.gateway.service] if base.gateway and i == 0 else [])))
