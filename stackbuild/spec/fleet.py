"""The fleet part of the spec: hosts with per-host overrides, and the rollout policy.

Kept out of stackbuild/spec/stack.py so the spec module only grows two fields
(`host.hosts`, `host.inventory`, `host.fleet`); the same models validate an
inventory file.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

from stackbuild.spec.kinds import LONG_FLAG, SshTarget, Text, Version

FlagValue = str | int | float | bool | list[str | int | float] | None
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_WAVE = re.compile(r"^(\d{1,3})%$")


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FleetHost(_Model):
    """One host of the fleet. Unset overrides take the stack's own value."""

    name: str
    address: SshTarget | None = None  # [USER@]HOST[:PORT] or an ~/.ssh/config alias; default: name
    port: int | None = Field(None, ge=1, le=65535)
    staging_port: int | None = Field(None, ge=1, le=65535)
    service: str | None = None
    gpus: Literal["all", "none"] | int | None = None
    driver: Version | None = None
    gpu_model: Text | None = None  # with gpus and driver: the host class hosts are compared within
    flags: dict[str, FlagValue] = Field(default_factory=dict)  # merged over server.flags

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("host names are letters, digits, '.', '_' and '-' (at most 63)")
        return v

    @field_validator("service")
    @classmethod
    def _service(cls, v: str | None) -> str | None:
        if v is not None and not _NAME.match(v):
            raise ValueError("a service name is letters, digits, '.', '_' and '-' (it names a unit)")
        return v

    @field_validator("flags")
    @classmethod
    def _flags(cls, v: dict[str, FlagValue]) -> dict[str, FlagValue]:
        bad = [k for k in v if not LONG_FLAG.fullmatch(k)]
        if bad:
            raise ValueError(f"flags are long options like '--speed'; not: {', '.join(map(repr, bad))}")
        return v

    @property
    def target(self) -> str:
        return self.address or self.name


WaveStep = StrictInt | str  # strict: YAML `true` is not a host count


class Fleet(_Model):
    """How a rollout proceeds. `waves` are cumulative targets: [1, "25%", "100%"]."""

    waves: tuple[WaveStep, ...] = (1, "100%")
    max_parallel: int | None = Field(None, ge=1)  # split every wave after the canary into chunks
    pull_parallel: int = Field(4, ge=1)
    on_failure: Literal["halt", "rollback_all"] = "halt"
    soak_s: float = Field(0.0, ge=0)  # bake time after each wave
    soak_interval_s: float = Field(1.0, gt=0)
    # a host whose candidate reads further than this off the canary (relative, per
    # concurrency level) is flagged; None: the gate profile's tolerance, doubled
    outlier_tolerance: float | None = Field(None, gt=0, lt=1)

    @field_validator("waves")
    @classmethod
    def _waves(cls, v: tuple[WaveStep, ...]) -> tuple[WaveStep, ...]:
        if not v:
            raise ValueError("waves: give at least one step, e.g. [1, '25%', '100%']")
        for w in v:
            if isinstance(w, bool) or (isinstance(w, int) and w < 1):
                raise ValueError("a wave is a host count >= 1 or a percentage like '25%'")
            if isinstance(w, str):
                m = _WAVE.match(w)
                if not m or not 1 <= int(m[1]) <= 100:
                    raise ValueError(f"wave {w!r}: write a percentage 1%..100%, or a host count")
        return v


class Inventory(_Model):
    """An inventory file: `hosts:` and optionally `fleet:` (overrides the stack's)."""

    hosts: tuple[FleetHost, ...]
    fleet: Fleet | None = None
