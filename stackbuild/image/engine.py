"""The Docker Engine, through the SDK: inspect, tag, remove, push, pull, run (smoke tests)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import tenacity

from stackbuild.errors import InfraError

DEFAULT_SOCKET = "unix:///var/run/docker.sock"


def client() -> Any:
    import docker  # the SDK costs ~0.3 s to import: only what talks to the daemon pays for it

    where = os.environ.get("DOCKER_HOST", DEFAULT_SOCKET)
    try:
        c = docker.from_env(timeout=300)
        c.ping()
    except Exception as err:  # the SDK raises DockerException, requests' and OSError variants
        raise InfraError(
            f"Docker daemon not reachable at {where} ({type(err).__name__}); "
            "start it (bash scripts/infra/up.sh) or set DOCKER_HOST"
        ) from err
    return c


def image_attrs(c: Any, ref: str) -> dict[str, Any] | None:
    import docker.errors  # loads the whole SDK (~0.3 s): lazy, like client()

    try:
        attrs: dict[str, Any] = c.images.get(ref).attrs
    except docker.errors.ImageNotFound:
        return None
    return attrs


def labels_of(attrs: dict[str, Any]) -> dict[str, str]:
    return dict((attrs.get("Config") or {}).get("Labels") or {})


def tag(c: Any, image_id: str, ref: str) -> None:
    repo, _, t = ref.rpartition(":")
    if not c.images.get(image_id).tag(repo, t):
        raise InfraError(f"docker: could not tag {image_id} as {ref}")


def untag(c: Any, ref: str) -> None:
    import docker.errors  # loads the whole SDK (~0.3 s): lazy, like client()

    with suppress(docker.errors.ImageNotFound):
        c.images.remove(ref, noprune=True)


class PushError(InfraError):
    """A push failure; `transient` says whether a retry may help."""

    def __init__(self, message: str, *, transient: bool) -> None:
        self.transient = transient
        super().__init__(message)


_TRANSIENT = (
    "connection refused",
    "connection reset",
    "timeout",
    "eof",
    "503",
    "502",
    "500",
    "broken pipe",
    "temporarily",
    "too many requests",
    "i/o",
)


def push_once(c: Any, ref: str, auth: dict[str, str] | None) -> str:
    """Push and return the manifest digest; PushError on failure."""
    repo, _, t = ref.rpartition(":")
    digest = ""
    try:
        for ev in c.api.push(repo, tag=t, stream=True, decode=True, auth_config=auth):
            if "error" in ev:
                msg = str(ev.get("error"))
                raise PushError(f"push of {ref} failed: {msg}", transient=any(k in msg.lower() for k in _TRANSIENT))
            aux = ev.get("aux") or {}
            digest = aux.get("Digest", digest)
    except PushError:
        raise
    except Exception as err:
        raise PushError(f"push of {ref} failed: {err}", transient=True) from err
    if not digest:
        raise PushError(f"push of {ref} reported no digest", transient=True)
    return str(digest)


def push(c: Any, ref: str, *, attempts: int = 4, deadline_s: float = 600) -> str:
    user, pw = os.environ.get("STACKBUILD_REGISTRY_USER"), os.environ.get("STACKBUILD_REGISTRY_PASSWORD")
    auth = {"username": user, "password": pw} if user and pw else None
    retry = tenacity.Retrying(
        retry=tenacity.retry_if_exception(lambda e: isinstance(e, PushError) and e.transient),
        stop=tenacity.stop_after_attempt(attempts) | tenacity.stop_before_delay(deadline_s),
        wait=tenacity.wait_exponential(multiplier=0.5, max=8),
        reraise=True,
    )
    digest: str = retry(push_once, c, ref, auth)
    return digest


def pull(c: Any, ref: str) -> str:
    """Pull by tag or digest; returns the local image id."""
    try:
        img = c.images.pull(ref)
    except Exception as err:
        raise InfraError(f"pull of {ref} failed: {err}") from err
    return str(img.id)


@contextmanager
def running(c: Any, image: str, command: list[str], *, network: str = "host") -> Iterator[Any]:
    """A detached container that is removed however the block ends."""
    ctr = c.containers.run(image, command, detach=True, network_mode=network, labels={"dev.stackbuild.smoke": "1"})
    try:
        yield ctr
    finally:
        with suppress(Exception):
            ctr.remove(force=True)


def run_once(c: Any, image: str, command: list[str], *, timeout: float = 300) -> tuple[int, str]:
    """Run a command to completion with no network; (exit code, combined output)."""
    with running(c, image, command, network="none") as ctr:
        try:
            rc = int(ctr.wait(timeout=timeout)["StatusCode"])
        except Exception as err:
            raise InfraError(f"smoke test: `{' '.join(command)}` in {image} did not finish: {err}") from err
        out = ctr.logs(stdout=True, stderr=True).decode(errors="replace")
    return rc, out
