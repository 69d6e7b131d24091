"""The `gateway:` section of a stack: SGLang's own gateway (smg) in front of the stack's servers.

Which host runs it, where it listens, how it routes and how it checks its workers.
Every field maps to one `smg launch` option of the pinned release (smg 1.13.0's
`router_args.py`), so a value here is a value there; render/gateway.py spells
the command line, effects/gateway.py talks to the running gateway. See docs/gateway.md.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator

from stackbuild.spec.kinds import EnvName, Ident, ImageRef, SshTarget, Version

# smg 1.13.0 `smg launch --policy` choices (router_args.py COMMON_POLICY_CHOICES)
Policy = Literal[
    "random", "round_robin", "passthrough", "cache_aware", "power_of_two", "least_load", "manual",
    "consistent_hashing", "prefix_hash",
]
_HTTP_PATH = re.compile(r"/[A-Za-z0-9._~/-]{0,200}")


def _listen(v: str) -> str:
    try:
        ipaddress.ip_address(v)
    except ValueError:
        raise ValueError("not an IP address to listen on, like 0.0.0.0 or 127.0.0.1") from None
    return v


def _http_path(v: str) -> str:
    if not _HTTP_PATH.fullmatch(v):
        raise ValueError("not an HTTP path like /health")
    return v


# a fleet host's name, or an address as ssh takes it: [USER@]HOST[:PORT], an ~/.ssh/config alias
GatewayHost = SshTarget
ListenAddress = Annotated[str, AfterValidator(_listen)]
HttpPath = Annotated[str, AfterValidator(_http_path)]
Port = Annotated[int, Field(ge=1, le=65535)]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class HealthCheck(_Model):
    """smg's own probing of its workers (--health-check-*, --health-*-threshold).

    Defaults are smg's, but the interval: smg probes every 60 s, so a dead worker would take
    three minutes to leave the pool by probing alone (it retries elsewhere meanwhile).
    """

    interval_s: int = Field(10, ge=1)
    timeout_s: int = 5
    failure_threshold: int = Field(3, ge=1)
    success_threshold: int = Field(2, ge=1)
    endpoint: HttpPath = "/health"

    @field_validator("timeout_s")
    @classmethod
    def _outlasts_sglangs_health(cls, v: int) -> int:
        # sglang's /health submits a one-token generation and looks for output once a second
        # (0.5.23 entrypoints/http_server.py:775, SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION on by default)
        if v < 2:
            raise ValueError("sglang's /health answers after a second at the earliest; give it at least 2")
        return v


class Gateway(_Model):
    version: Version = "1.13.0"  # smg on PyPI; its closure is hash-locked under stacks/locks/gateway/
    # resolve smg's closure as of this instant (RFC 3339), as lock.exclude_newer does the stack's: a relock
    # writes the same file
    exclude_newer: str | None = None
    host: GatewayHost | None = None  # where it runs; default: the stack's host (host.address)
    listen: ListenAddress = "0.0.0.0"  # clients reach it from other machines (validate warns without api_keys)
    port: Port = 30080
    metrics_port: Port = 29000  # smg's Prometheus listener, bound to 127.0.0.1
    policy: Policy = "cache_aware"  # smg's default: requests sharing a prefix meet its KV cache
    health: HealthCheck = Field(default_factory=HealthCheck)
    retries: int = Field(5, ge=1, le=20)  # attempts per request (smg --retry-max-retries; 1: no retry)
    drain_timeout_s: float = Field(600.0, gt=0)  # how long a drained worker's in-flight requests may take
    shutdown_grace_s: int = Field(180, ge=0)  # smg --shutdown-grace-period-secs: in-flight requests on stop
    service: Ident = "stackbuild-gateway"  # its unit and container name
    base_image: ImageRef = "debian:bookworm-slim"  # the gateway image's base: python3 from its apt
    # serving-path keys: names whose values the gateway host's secrets file holds (/etc/stackbuild/
    # <service>.env, 0600); each becomes one smg --tenant-api-key, and clients send one as
    # `Authorization: Bearer KEY`. None: the serving routes answer whoever reaches `listen:port`.
    api_keys: tuple[EnvName, ...] = ()
