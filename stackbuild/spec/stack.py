"""The stack spec's typed, frozen model: what a `Stack` holds once loaded (load.py builds it).

Every value reaching a unit, a Dockerfile, a shell or a path has a kind (kinds.py)
checked here (and in the components' models, which live with their table in
components.py), at the one boundary for user input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, field_validator

from stackbuild.spec.components import Components
from stackbuild.spec.fleet import Fleet, FleetHost
from stackbuild.spec.gateway import Gateway
from stackbuild.spec.kinds import (
    LONG_FLAG as _LONG_FLAG,
)
from stackbuild.spec.kinds import (
    AbsPath,
    AptPackage,
    CudaVersion,
    EnvName,
    Ident,
    ImageRef,
    PyVersion,
    Registry,
    Size,
    SourceLine,
    SshTarget,
    Text,
)
from stackbuild.spec.profile import GateProfile
from stackbuild.spec.yamlpos import Located

FlagValue = str | int | float | bool | list[str | int | float] | None


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Patch(_Model):
    path: Path  # absolute, resolved against the stack root
    sha256: str
    text: str

    @property
    def name(self) -> str:
        return self.path.name


class LogLine(_Model):
    """A line the server prints at startup: `text` is matched as a substring of each log line."""

    text: Annotated[Text, Field(min_length=8)]
    source: SourceLine  # the release's source line that prints it: the expectation's proof

    def __str__(self) -> str:
        return f"'{self.text}' ({self.source})"


class ExpectLog(_Model):
    """What the server's startup log must show before its numbers count (the readiness step reads it).

    A variant named for a code path (an all-reduce backend) proves it runs that path: `present` lines
    the path prints, `absent` lines its fallbacks print.
    """

    present: tuple[LogLine, ...] = ()
    absent: tuple[LogLine, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.present or self.absent)


class Server(_Model):
    engine: Literal["sglang", "sim"] = "sglang"
    model_path: Text
    served_model_name: Text | None = None
    flags: dict[str, FlagValue] = Field(default_factory=dict)
    env: dict[EnvName, str] = Field(default_factory=dict)
    expect_log: ExpectLog = Field(default_factory=ExpectLog)

    @field_validator("flags")
    @classmethod
    def _flags_are_long_options(cls, v: dict[str, FlagValue]) -> dict[str, FlagValue]:
        for k in v:
            if not k.startswith("--"):
                raise ValueError(f"flag '{k}' must be spelled as a long option, e.g. '--{k.lstrip('-')}'")
            if not _LONG_FLAG.fullmatch(k):
                raise ValueError(f"flag {k!r} is not a long option of letters, digits, - and _")
        return v

    def flag(self, name: str) -> FlagValue:
        return self.flags.get(name)


class Runtime(_Model):
    gpus: Literal["all", "none"] | int = "all"
    tp: int = 1
    shm_size: Size = "32g"
    ipc: Literal["host", "private", "shareable"] = "host"
    ulimits: dict[Ident, str | int] = Field(default_factory=lambda: dict[str, str | int](memlock=-1, stack=67108864))
    port: int = Field(30000, ge=1, le=65535)
    staging_port: int = Field(30001, ge=1, le=65535)
    volumes: tuple[str, ...] = ()
    secrets: tuple[EnvName, ...] = ()  # names only; values live in the host's EnvironmentFile
    start_timeout_s: int = Field(1800, ge=1)
    ready_timeout_s: int = Field(1800, ge=1)
    restart: Literal["no", "on-failure", "always"] = "on-failure"

    @field_validator("staging_port")
    @classmethod
    def _own_staging_port(cls, v: int, info: ValidationInfo) -> int:
        # a candidate on the incumbent's port dies with "address already in use" while every probe
        # reaches the incumbent (spec/addresses.py)
        if v == info.data.get("port", 30000):
            raise ValueError(f"staging_port {v} is runtime.port too; the candidate must bind a port the "
                             "incumbent does not hold: give it another staging_port")
        return v

    @property
    def gpu_count(self) -> int | None:
        return self.gpus if isinstance(self.gpus, int) else None


class Build(_Model):
    max_jobs: int | None = None
    nvcc_threads: int | None = None
    secrets: tuple[EnvName, ...] = ()  # BuildKit secret ids, mounted only on fetch steps
    apt: tuple[AptPackage, ...] = ()


class LockSpec(_Model):
    """Inputs to `stackbuild lock` beyond the components: what pins the resolution in time and space."""

    # Resolve as of this instant (RFC 3339): an old release's unpinned dependencies move on after it.
    exclude_newer: str | None = None
    constraints: tuple[str, ...] = ()  # extra `name<op>version` constraints, each with its reason in the YAML
    platform: str | None = None  # uv --python-platform; default from the base image's distro


class GateSpec(_Model):
    default_profile: str = "quick"
    profiles: dict[str, GateProfile] = Field(default_factory=dict)


# How a deploy brings its candidate in: strategy name -> the module of stackbuild/host/strategies/ that
# does it (host/strategy.py loads it). A spec names swap or side-by-side; take-over is what side-by-side
# becomes where the candidate can keep its own unit (behind a gateway, or on the main unit already).
# A new strategy is its module plus one line here (and its commands in testing/fake_host.py).
STRATEGY_MODULES: dict[str, str] = {
    "swap": "stackbuild.host.strategies.swap",
    "side-by-side": "stackbuild.host.strategies.side_by_side",
    "take-over": "stackbuild.host.strategies.take_over",
}


class Host(_Model):
    address: SshTarget | None = None
    service: Ident = "sglang"
    strategy: Literal["swap", "side-by-side"] = "swap"  # a name in STRATEGY_MODULES
    registry: Registry | None = None  # HOST:PORT/REPO
    channel: Ident | None = None
    state_dir: AbsPath = "/var/lib/stackbuild"
    driver: str | None = None  # known driver version, checked against the CUDA floor
    hosts: tuple[FleetHost, ...] = ()  # a fleet (deploy --fleet); per-host overrides
    inventory: str | None = None  # or a YAML file of hosts, relative to the stack root
    fleet: Fleet = Field(default_factory=Fleet)


class Stack(_Model):
    name: Ident
    variant: Ident | None = None
    source: Path
    root: Path
    description: Text = ""
    base_image: ImageRef
    cuda: CudaVersion | None
    arches: tuple[Ident, ...] = ()
    python: PyVersion = "3.12"
    components: Components = Field(default_factory=Components)
    patches: tuple[Patch, ...] = ()
    server: Server
    runtime: Runtime = Field(default_factory=Runtime)
    build: Build = Field(default_factory=Build)
    lock: LockSpec = Field(default_factory=LockSpec)
    gate: GateSpec = Field(default_factory=GateSpec)
    host: Host = Field(default_factory=Host)
    gateway: Gateway | None = None  # smg in front of the stack's servers (spec/gateway.py)
    variants: tuple[str, ...] = ()  # names of all variants this stack offers
    _located: Located | None = PrivateAttr(default=None)

    @property
    def label(self) -> str:
        return f"{self.name}-{self.variant}" if self.variant else self.name

    @property
    def sglang_version(self) -> str | None:
        c = self.components.get("sglang")
        return c.version if c else None

    @property
    def cuda_mm(self) -> tuple[int, int] | None:
        if not self.cuda:
            return None
        parts = [*self.cuda.split("."), "0"]
        return int(parts[0]), int(parts[1])


# Keys handled by the loader itself, not part of the model.
