"""`stackbuild gate` and `stackbuild sim`: thin wrappers over builder.gate and builder.sim."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from builder.errors import InputError


@click.command("sim")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=30000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--profile", default="baseline", show_default=True,
              help="baseline, eagle3-topk1-v2 or eagle3-topk4-v1")
@click.option("--fault", default=None,
              help="crash-on-start, never-ready, fail-first-generation, garbage[:repeat|empty|fffd], "
                   "slow:FACTOR, die-after:N, stall-stream")
@click.option("--speed", default=1.0, show_default=True, type=click.FloatRange(min=0.001),
              help="multiplies every rate (tok/s) of the timing model")
@click.option("--warmup-s", default=1.0, show_default=True, type=click.FloatRange(min=0),
              help="seconds /health answers 503 after the port opens")
@click.option("--load-s", default=0.0, show_default=True, type=click.FloatRange(min=0),
              help="seconds before the port opens (weights loading)")
@click.option("--seed", default=0, show_default=True, type=int, help="seed of the noise model")
@click.option("--model-path", default="sim/model", show_default=True)
@click.option("--served-model-name", default=None)
def sim_cmd(host: str, port: int, profile: str, fault: str | None, speed: float,
            warmup_s: float, load_s: float, seed: int, model_path: str,
            served_model_name: str | None) -> None:
    """Run the SGLang-compatible simulated server (no GPU)."""
    import asyncio

    from builder.cli import set_exit
    from builder.sim.faults import parse_fault
    from builder.sim.profiles import PROFILES
    from builder.sim.server import SimOptions, serve

    if profile not in PROFILES:
        raise InputError(f"--profile: unknown simulator profile {profile!r}; "
                         f"use one of: {', '.join(PROFILES)}")
    try:
        parsed = parse_fault(fault)
    except ValueError as err:
        raise InputError(f"--fault: {err}") from None
    opts = SimOptions(host=host, port=port, profile=profile, speed=speed, fault=parsed,
                      warmup_s=warmup_s, load_s=load_s, seed=seed, model_path=model_path,
                      served_model_name=served_model_name)
    try:
        rc = asyncio.run(serve(opts))
    except OSError as err:
        from builder.errors import InfraError

        raise InfraError(f"sim: cannot listen on {host}:{port}: {err.strerror or err}; "
                         "pick a free --port") from None
    set_exit(rc)
