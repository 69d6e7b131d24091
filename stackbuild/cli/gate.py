"""`stackbuild gate` and `stackbuild sim`: thin wrappers over stackbuild.gate and stackbuild.sim."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from stackbuild.cli.progress import progress_option, wants_live
from stackbuild.errors import InputError


@click.command("sim")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=30000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--profile", default="baseline", show_default=True,
              help="baseline, eagle3-topk1-v2 or eagle3-topk4-v1")
@click.option("--fault", default=None,
              help="crash-on-start, never-ready, fail-first-generation, garbage[:repeat|empty|fffd], "
                   "slow:FACTOR, die-after:N, stall-stream, diverge:N, drift, detokenizer, "
                   "chat-template, long-context:N, concurrency:K")
@click.option("--speed", default=1.0, show_default=True, type=click.FloatRange(min=0.001),
              help="multiplies every rate (tok/s) of the timing model")
@click.option("--warmup-s", default=1.0, show_default=True, type=click.FloatRange(min=0),
              help="seconds /health answers 503 after the port opens")
@click.option("--load-s", default=0.0, show_default=True, type=click.FloatRange(min=0),
              help="seconds before the port opens (weights loading)")
@click.option("--seed", default=0, show_default=True, type=int, help="seed of the noise model")
@click.option("--model-path", default="sim/model", show_default=True)
@click.option("--served-model-name", default=None)
@click.option("--max-running-requests", default=None, type=click.IntRange(min=1),
              help="cap on running requests, as in sglang (default: 48 with speculation, else 1024)")
@click.option("--enable-metrics", is_flag=True,
              help="serve /metrics (Prometheus), as sglang does only with this flag")
@click.option("--context-length", default=262144, show_default=True, type=click.IntRange(min=2),
              help="longest prompt + output in tokens; longer ones are refused, as in sglang")
@click.option("--tp-size", default=1, show_default=True, type=click.IntRange(min=1),
              help="sglang's tensor parallel size: what the startup log says of the TP all-reduce")
@click.option("--flashinfer-allreduce-fusion-backend", "fusion_backend", default=None,
              type=click.Choice(["auto", "trtllm", "mnnvl"]),
              help="as sglang: try FlashInfer's all-reduce first (its workspace preflight is logged)")
@click.option("--host-multicast", is_flag=True,
              help="simulate GPUs with multicast (NVLink); default: the users' PCIe-only cards, without")
@click.option("--weight-version", default="default", show_default=True,
              help="a label /get_model_info, /server_info and every answer's meta_info carry, as in sglang")
def sim_cmd(host: str, port: int, profile: str, fault: str | None, speed: float,
            warmup_s: float, load_s: float, seed: int, model_path: str,
            served_model_name: str | None, max_running_requests: int | None,
            enable_metrics: bool, context_length: int, tp_size: int, fusion_backend: str | None,
            host_multicast: bool, weight_version: str) -> None:
    """Run the SGLang-compatible simulated server (no GPU)."""
    import asyncio
    import os

    from stackbuild.cli.main import set_exit
    from stackbuild.sim.calibration import PROFILES
    from stackbuild.sim.faults import parse_fault
    from stackbuild.sim.server import SimOptions, serve
    from stackbuild.sim.startup import AllReduceSetup

    if profile not in PROFILES:
        raise InputError(f"--profile: unknown simulator profile {profile!r}; "
                         f"use one of: {', '.join(PROFILES)}")
    try:
        parsed = parse_fault(fault)
    except ValueError as err:
        raise InputError(f"--fault: {err}") from None
    opts = SimOptions(host=host, port=port, profile=profile, speed=speed, fault=parsed,
                      warmup_s=warmup_s, load_s=load_s, seed=seed, model_path=model_path,
                      served_model_name=served_model_name, max_running_requests=max_running_requests,
                      enable_metrics=enable_metrics, context_length=context_length,
                      weight_version=weight_version,
                      allreduce=AllReduceSetup(tp=tp_size, fusion_backend=fusion_backend, multicast=host_multicast,
                                               pcie_ipc_env=os.environ.get("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE")))
    try:
        rc = asyncio.run(serve(opts))
    except OSError as err:
        from stackbuild.errors import InfraError

        raise InfraError(f"sim: cannot listen on {host}:{port}: {err.strerror or err}; "
                         "pick a free --port") from None
    set_exit(rc)


def _levels(value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        levels = tuple(int(x) for x in value.split(",") if x.strip())
    except ValueError:
        raise InputError(f"--concurrency: {value!r} is not a comma-separated list of "
                         "integers, e.g. 1,30,250") from None
    return levels


def _level_bars(values: tuple[str, ...]) -> dict[int, dict[str, Any]] | None:
    """`--level-tolerance C=PCT`: at C the candidate may lose up to PCT%; a negative PCT is a
    required gain (`8=-5`: must be 5% faster at C=8)."""
    out: dict[int, dict[str, Any]] = {}
    for v in values:
        c, sep, pct = v.partition("=")
        try:
            level, p = int(c), float(pct)
        except ValueError:
            level, p = 0, float("nan")
        if not sep or level < 1 or p != p or p >= 100:
            raise InputError(f"--level-tolerance: {v!r} is not C=PCT with C a concurrency >= 1 "
                             "and PCT < 100, e.g. --level-tolerance 1=8 --level-tolerance 30=0")
        out[level] = {"tolerance": p / 100.0} if p >= 0 else {"min_gain": -p / 100.0}
    return out or None


def _slo(text: str | None) -> dict[str, float] | None:
    if text is None:
        return None
    from stackbuild.gate.capacity import parse_slo

    try:
        return parse_slo(text)
    except ValueError as err:
        raise InputError(f"--slo: {err}") from None


def _read_traffic(path: Path | None) -> dict[int, float] | None:
    if path is None:
        return None
    import json

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        weights = {int(c): float(w) for c, w in data["weights"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise InputError(f"{path}: not a traffic file ({type(err).__name__}: {err}); "
                         "write one with `stackbuild traffic --url URL --for 10m --out FILE`") \
            from None
    return weights


@click.command("traffic")
@click.option("--url", required=True, help="the incumbent server, e.g. http://127.0.0.1:30000")
@click.option("--for", "window", default="10m", show_default=True,
              help="how long to sample, e.g. 30s, 10m, 1h")
@click.option("--every", default=1.0, show_default=True, type=click.FloatRange(min=0.05),
              help="seconds between samples of /metrics")
@click.option("--concurrency", "levels_text", default="1,8,30,250", show_default=True,
              help="the gate levels the samples are mapped onto")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="write the traffic profile (JSON) here; `stackbuild gate --traffic FILE`")
def traffic_cmd(url: str, window: str, every: float, levels_text: str, out: Path | None) -> None:
    """Sample a server's requests in flight from /metrics and write traffic weights per level."""
    import asyncio
    import json

    from stackbuild.gate.formats import write_text
    from stackbuild.gate.traffic import parse_duration, sample, weights

    try:
        seconds = parse_duration(window)
    except ValueError as err:
        raise InputError(f"--for: {err}") from None
    levels = _levels(levels_text) or (1,)
    samples = asyncio.run(sample(url.rstrip("/"), seconds, every))
    w, idle = weights(samples, levels)
    body = {"url": url, "window_s": seconds, "samples": len(samples), "idle": idle,
            "weights": {str(c): x for c, x in sorted(w.items())}}
    text = json.dumps(body, indent=2) + "\n"
    if out:
        write_text(out, text)
    click.echo(text, nl=False)


def _resolve_profile(ctx: click.Context, stack: str | None, name: str | None) -> Any:
    from stackbuild.spec.profile import BUILTIN_PROFILES

    if stack is None:
        chosen = name or "quick"
        if chosen not in BUILTIN_PROFILES:
            raise InputError(f"--profile: no built-in gate profile {chosen!r} (built-in: "
                             f"{', '.join(BUILTIN_PROFILES)}); or pass --stack STACK")
        return BUILTIN_PROFILES[chosen]
    from stackbuild.spec.load import load_stack

    spec = load_stack(stack, root=(ctx.obj or {}).get("root"))
    chosen = name or spec.gate.default_profile
    profiles = {**BUILTIN_PROFILES, **spec.gate.profiles}
    if chosen not in profiles:
        raise InputError(f"{spec.source}: gate.profiles has no {chosen!r} (has: "
                         f"{', '.join(profiles)}); add it or pick another --profile")
    return profiles[chosen]


def _plan(ctx: click.Context, profile: Any, ledger: Path | None, *, baseline_file: Path | None,
          name: str) -> str:
    from stackbuild.gate.formats import read_json
    from stackbuild.gate.runner import is_fresh
    from stackbuild.results.ledger import gate_plan, ledger_path

    # a stored baseline is judged as the gate will judge it: of this session or not
    fresh = baseline_file is None or is_fresh(read_json(baseline_file), profile)
    return gate_plan(profile, ledger_path(ledger, (ctx.obj or {}).get("root")),
                     stored=baseline_file is not None, name=name, fresh=fresh)


@click.command("gate")
@click.option("--url", help="the candidate server, e.g. http://127.0.0.1:30000 (not with --plan)")
@click.option("--baseline", "baseline_file", type=click.Path(dir_okay=False, path_type=Path),
              help="the incumbent's stored result (a --json file of an earlier gate)")
@click.option("--baseline-url", help="a live incumbent server, measured in alternation")
@click.option("--stack", help="take gate profiles from this stack spec")
@click.option("--profile", "profile_name", help="gate profile (default: the stack's, else quick)")
@click.option("--name", default="candidate", show_default=True,
              help="label of the measured configuration in the results")
@click.option("--ledger", type=click.Path(dir_okay=False, path_type=Path),
              help="record the result in this ledger")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--junit", "junit_out", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--concurrency", help="levels, e.g. 1,30,250")
@click.option("--runs", type=click.IntRange(min=1))
@click.option("--max-runs", type=click.IntRange(min=1))
@click.option("--warmup", type=click.IntRange(min=0))
@click.option("--input-len", type=click.IntRange(min=1))
@click.option("--output-len", type=click.IntRange(min=2))
@click.option("--requests-per-slot", type=click.IntRange(min=1))
@click.option("--min-requests", type=click.IntRange(min=0), help="requests per run at least")
@click.option("--tolerance", type=click.FloatRange(0, 99), help="percent, e.g. 5")
@click.option("--margin", type=click.FloatRange(0, 99),
              help="percent: where a level must not lose (tolerance 0), the smallest loss that "
                   "fails it (default 2)")
@click.option("--decide-on", "decide_on", type=click.Choice(["levels", "traffic"]),
              help="what decides: each required level, or the traffic-weighted change "
                   "(needs --traffic or traffic: in the profile)")
@click.option("--within-gate-drift", "within_gate_drift",
              type=click.Choice(["auto", "none", "linear"]),
              help="how a baseline measured right before a swap, in mirror order, is compared: "
                   "auto (default) plain unless the paired runs trend with time, then "
                   "detrended; linear: always detrended (wider: equal builds pass less "
                   "often); none: always plain")
@click.option("--within-gate-walk", "within_gate_walk", type=click.FloatRange(0, 1, max_open=True),
              help="under auto, the random walk of the machine a swap compared plain allows for, "
                   "a run, as a ratio of a pair's own variance (default 0.05; 0: none)")
@click.option("--run-correlation", "run_correlation", type=click.FloatRange(0, 0.9, max_open=True),
              help="the largest lag-1 correlation of successive runs the boundaries allow for "
                   "(default 0.4; `--plan` shows what the ledger's runs had)")
@click.option("--plan", "plan_only", is_flag=True,
              help="print the expected run counts and duration at the noise the ledger has "
                   "seen (--ledger, else the project's) and exit; measures nothing")
@click.option("--level-tolerance", "level_tolerance", multiple=True, metavar="C=PCT",
              help="at concurrency C the candidate may lose up to PCT% (negative: must gain "
                   "-PCT%); repeatable, overrides the profile's bar at that level")
@click.option("--slo", metavar="KEY=MS,...",
              help="capacity under SLOs: ttft_p99_ms, itl_p99_ms, tpot_p99_ms, e.g. "
                   "ttft_p99_ms=2000,itl_p99_ms=50; finds the highest concurrency where all hold")
@click.option("--require-capacity/--no-require-capacity", default=None,
              help="fail when the candidate's capacity under the SLOs is below the incumbent's")
@click.option("--traffic", "traffic_file", type=click.Path(dir_okay=False, path_type=Path),
              help="traffic weights written by `stackbuild traffic`: adds the expected "
                   "throughput change on that traffic")
@click.option("--api", type=click.Choice(["completions", "generate"]))
@click.option("--model", help="model name sent in requests")
@click.option("--seed", type=int)
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0.1), help="per request, s")
@click.option("--stall-timeout", "stall_timeout_s", type=click.FloatRange(min=0.1),
              help="a request with no byte for this long fails as stalled, s")
@click.option("--deadline", "deadline_s", type=click.FloatRange(min=0.1),
              help="the whole gate's bound, s (default: derived from the workload's timeouts)")
@click.option("--ready-timeout", "ready_timeout_s", type=click.FloatRange(min=0.1),
              help="seconds the server may take to serve before measuring (exit 4 after)")
@click.option("--min-tok-s-c1", type=float)
@click.option("--max-ttft-p99-ms", type=float)
@click.option("--max-failed-requests", type=click.IntRange(min=0))
@progress_option
@click.pass_context
def gate_cmd(ctx: click.Context, /, url: str | None, baseline_file: Path | None,
             baseline_url: str | None, stack: str | None, profile_name: str | None, name: str,
             ledger: Path | None, json_out: Path | None, junit_out: Path | None,
             concurrency: str | None, tolerance: float | None, margin: float | None,
             level_tolerance: tuple[str, ...], slo: str | None, traffic_file: Path | None,
             plan_only: bool, show_progress: bool | None, **overrides: Any) -> None:
    """Measure a server against an incumbent and decide: exit 0 pass, 1 fail, 3 inconclusive."""
    from pydantic import ValidationError

    from stackbuild.errors import GateFailed, GateInconclusive
    from stackbuild.gate.formats import markdown_summary, read_json, write_json, write_junit
    from stackbuild.gate.runner import run_gate
    from stackbuild.results.outputs import check_writable
    from stackbuild.results.recorder import Recorder

    for path, flag in ((json_out, "--json"), (junit_out, "--junit")):
        if path:
            check_writable(path, flag)  # before minutes of measuring, not after
    recorder = Recorder(ledger) if ledger else None
    if recorder:
        recorder.check()
    profile = _resolve_profile(ctx, stack, profile_name)
    try:
        profile = profile.with_overrides(
            concurrency=_levels(concurrency),
            tolerance=None if tolerance is None else tolerance / 100.0,
            margin=None if margin is None else margin / 100.0,
            levels=_level_bars(level_tolerance), slo=_slo(slo),
            traffic=_read_traffic(traffic_file), **overrides)
    except ValidationError as err:
        e = err.errors()[0]
        raise InputError(f"--{'-'.join(map(str, e['loc'])).replace('_', '-')}: {e['msg']}") \
            from None
    if plan_only:
        click.echo(_plan(ctx, profile, ledger, baseline_file=baseline_file,
                         name=profile_name or ""))
        return
    if not url:
        raise InputError("--url: missing; give the candidate server's URL, or --plan to "
                         "only see how long the gate would take")
    baseline = read_json(baseline_file) if baseline_file else None
    if wants_live(show_progress):
        from stackbuild.gate.progress import LiveProgress

        with LiveProgress() as prog:
            result = run_gate(url, profile, name=name, baseline=baseline,
                              baseline_url=baseline_url, progress=prog)
    else:
        result = run_gate(url, profile, name=name, baseline=baseline, baseline_url=baseline_url)
    if json_out:
        write_json(result, json_out)
    if junit_out:
        write_junit(result, junit_out)
    click.echo(markdown_summary(result))
    if recorder:
        recorder.gate(result)
    why = "; ".join(result.reasons[:3]) or result.verdict
    if result.verdict == "fail":
        raise GateFailed(f"gate failed: {why}")
    if result.verdict == "inconclusive":
        raise GateInconclusive(f"gate inconclusive: {why}")
