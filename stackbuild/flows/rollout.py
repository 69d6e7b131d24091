"""Glue between `stackbuild deploy --fleet` / `status --fleet` and the rollout: hosts, image,
plan, rollout id (resumed from the ledger), the real ops, the per-host table."""

from __future__ import annotations

import secrets as _secrets
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from stackbuild.errors import InputError
from stackbuild.fleet.inventory import check_chosen, check_host_flags, fleet_of, select
from stackbuild.fleet.live import Held, only_rollout
from stackbuild.fleet.plan import emptying_waves, plan_waves
from stackbuild.fleet.rollout import FleetOps, HostRow, Prior, RolloutResult, Settings, run_rollout
from stackbuild.flows.deploy_host import RunOptions, deploy_args, gate_profile, resolve_gateway_image, resolve_image
from stackbuild.flows.rollout_ops import RealOps
from stackbuild.image import registry
from stackbuild.results.display import Display, Log, Sink
from stackbuild.results.ledger import Ledger
from stackbuild.results.outage import pool_outage
from stackbuild.results.recorder import Recorder
from stackbuild.results.steplog import StepLog, log_path
from stackbuild.spec.fleet import Fleet, FleetHost

# Builds the rollout's FleetOps: (the rollout's options, its hosts by name, the pinned image, the display)
MakeOps = Callable[[RunOptions, dict[str, FleetHost], str, Sink], FleetOps]


@dataclass(kw_only=True)
class FleetArgs(RunOptions):
    hosts: list[str] | None = None
    inventory: Path | None = None
    allow_outage: bool = False  # a wave that empties the gateway's pool goes ahead (else exit 2)
    dry_run: bool = False  # print the plan and stop: no build, no host
    on_failure: str | None = None
    soak_s: float | None = None


def settings_for(fleet: Fleet, args: FleetArgs, tolerance: float) -> Settings:
    return Settings(
        policy=args.on_failure or fleet.on_failure,
        soak_s=fleet.soak_s if args.soak_s is None else args.soak_s,
        soak_interval_s=fleet.soak_interval_s,
        pull_parallel=fleet.pull_parallel,
        outlier_tolerance=fleet.outlier_tolerance or min(0.9, 2 * tolerance),
    )


def real_ops(run: RunOptions, hosts: dict[str, FleetHost], image: str, sink: Sink) -> FleetOps:
    return RealOps(run=run, hosts=hosts, image=image, sink=sink)


def run_fleet(args: FleetArgs, echo: Callable[[str], None] = print, make_ops: MakeOps = real_ops) -> int:
    """The rollout of `args`: a re-run of the same command (same stack, image and digest) resumes
    the last rollout that did not complete, under its id."""
    declared, fleet = fleet_of(args.stack, args.inventory)
    hosts = select(declared, args.hosts, str(args.stack.source))
    check_chosen(args.stack, hosts)
    check_host_flags(args.stack, hosts, str(args.inventory or args.stack.source))
    profile = gate_profile(args.stack, args.profile_name)
    settings = settings_for(fleet, args, profile.tolerance)
    waves = plan_waves([h.name for h in hosts], fleet.waves, fleet.max_parallel)
    outage = outage_plan(args, hosts, waves, profile.gate_deadline_s())
    if args.dry_run:
        echo(f"fleet: plan: {plan_line(waves, settings)}")
        for line in outage:
            echo(f"fleet: {line}")
        if outage and not args.allow_outage:
            raise InputError(f"{outage[0]}; refused without --allow-outage")
        echo("fleet: dry run: no image built, no host touched")
        return 0
    if outage and not args.allow_outage:  # said and refused before any build, ledger or host
        raise InputError(f"{outage[0]}; refused without --allow-outage (or add hosts, or plan smaller waves)")
    recorder = Recorder(args.recorder_path, note=echo)
    recorder.check()  # before a build: a bad --ledger is found in seconds
    with only_rollout(recorder.path, args.stack.label) as live:  # a second live one: exit 4, named
        return _run_fleet(args, echo, make_ops, recorder, live, hosts, fleet, settings, waves)


def _run_fleet(args: FleetArgs, echo: Callable[[str], None], make_ops: MakeOps, recorder: Recorder, live: Held,
               hosts: list[FleetHost], fleet: Fleet, settings: Settings, waves: list[list[str]]) -> int:
    image, digest = resolve_image(deploy_args(args, stack=args.stack, host_text=""), echo)
    gateway_image = resolve_gateway_image(args, echo)
    with Ledger(recorder.path) as db:
        # killed (still "running"), stopped by a failed wave, or refused (a host down, a lease held)
        same = [r for r in db.rollouts() if r.stack == args.stack.label and r.digest == digest
                and r.image == image]
    last = same[-1] if same and same[-1].outcome != "completed" else None
    rollout_id = last.id if last else f"r{datetime.now(UTC):%Y%m%d%H%M%S}-{_secrets.token_hex(2)}"
    live.name(rollout_id)
    reference = next((h.medians for h in last.hosts if h.host == waves[0][0] and h.medians),
                     None) if last else None
    prior = Prior(datetime.fromisoformat(last.started_at), {
        h.host: HostRow(h.host, h.wave, h.outcome, h.verdict, h.detail, h.flagged, dict(h.medians))
        for h in last.hosts}) if last else None
    with StepLog(log_path(recorder.path, "rollout", rollout_id), args.secrets.values()).open() as steps:
        rows = recorder.start_rollout(id=rollout_id, stack=args.stack.label, image=image, digest=digest,
                                      policy=settings.policy, plan=waves)
        show = Display(echo=echo, live=args.progress, log=steps, title=f"rollout {rollout_id} of {args.stack.label}")
        say = show.note
        say(f"fleet: rollout {rollout_id}{' (resumed)' if last else ''} of {args.stack.label} {image}; "
            f"every step in {steps.path}")
        say(f"fleet: plan: {plan_line(waves, settings)}")
        for line in outage_plan(args, hosts, waves, gate_profile(args.stack, args.profile_name).gate_deadline_s()):
            say(f"fleet: {line}; going ahead: --allow-outage")
        if args.stack.gateway is not None:
            say("fleet: behind the gateway: each host is drained out of it before its server stops, and put "
                "back once it serves (the candidate only once it passed)")
        # what the ledger recorded goes to the log; that it could not record something, to the screen too
        recorder.note, recorder.warn = (lambda text: show(Log(text))), say
        show.hosts(h for w in waves for h in w)
        ops = make_ops(replace(args, ledger=recorder.path, gateway_image=gateway_image, lock_run=rollout_id),
                       {h.name: h for h in hosts}, image, show)
        with show:
            res = run_rollout(waves, ops, settings, rows, echo=say, reference=reference, prior=prior)
        if res.outcome == "completed" and args.stack.host.channel:
            registry.promote(image, channel=args.stack.host.channel)
            say(f"fleet: channel {args.stack.host.channel} -> {image}")
        echo("")
        echo(summary := table(res, rollout_id))
        show(Log(summary))
        say(f"fleet: rollout {rollout_id}: {res.outcome} (exit {res.exit_code}): {res.cause}"
            + ("; re-run the same command to resume" if res.outcome == "stopped" else "")
            + f"; every step in {steps.path}")
    return res.exit_code


def plan_line(waves: list[list[str]], settings: Settings) -> str:
    return (" | ".join(f"{'canary' if i == 0 else f'wave {i}'}: {', '.join(w)}" for i, w in enumerate(waves))
            + f"; on_failure={settings.policy}: a failed wave goes back to the incumbent"
            + (" and so does every earlier one" if settings.policy == "rollback_all" else ", earlier ones stay")
            + f"; soak {settings.soak_s:g}s after each wave; a host of the canary's class must read within "
            f"{settings.outlier_tolerance:.0%} of it")


def outage_plan(args: FleetArgs, hosts: list[FleetHost], waves: list[list[str]], gate_deadline_s: float) -> list[str]:
    """One line per wave that leaves the gateway's pool empty, with the outage's expected length (the
    rollout drains a wave's hosts for their deploys; without a gateway each host's own deploy says its
    outage, as a single deploy does)."""
    if args.stack.gateway is None:
        return []
    names = [h.name for h in hosts]
    return [f"OUTAGE: {'the canary' if i == 0 else f'wave {i}'} ({', '.join(waves[i])}) takes every host of the "
            f"pool out of the gateway at once; {pool_outage(args.recorder_path, args.stack, gate_deadline_s)}"
            for i in emptying_waves(waves, names)]


def table(res: RolloutResult, rollout_id: str) -> str:
    rows = [f"rollout {rollout_id}", "| host | wave | outcome | verdict | flagged | detail |",
            "|---|---|---|---|---|---|"]
    for r in sorted(res.rows.values(), key=lambda r: (r.wave, r.host)):
        detail = r.detail.splitlines()[0][:100].replace("|", "/") if r.detail else ""
        rows.append(f"| {r.host} | {'canary' if r.wave == 0 else r.wave} | {r.outcome} | {r.verdict or ''} | "
                    f"{'yes' if r.flagged else ''} | {detail} |")
    return "\n".join(rows)
