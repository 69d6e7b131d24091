"""Image references, pure: the one place that pins a tag to a digest and reads a pinned one back.

A reference is `HOST[:PORT]/REPO[:TAG][@sha256:HEX]`; the tag is whatever follows the last `:`
of the last path part, so a registry's port is never taken for one.
"""

from __future__ import annotations

import re

from stackbuild.errors import InputError
from stackbuild.spec.lock.base import digest_of, named

_PINNED = re.compile(r"^(?P<repo>[^@\s]+)@(?P<digest>sha256:[0-9a-f]{64})$")


def repository(image: str) -> str:
    """`HOST:PORT/REPO:TAG` or `...@digest` -> `HOST:PORT/REPO` (tag and digest dropped)."""
    repo = image.split("@", 1)[0]
    last = repo.rsplit("/", 1)[-1]
    if ":" in last:
        repo = repo[: len(repo) - len(last)] + last.split(":", 1)[0]
    return repo


def pin(image: str, digest: str) -> str:
    """`HOST:PORT/REPO:TAG` + digest -> `HOST:PORT/REPO@digest` (the tag dropped)."""
    return f"{repository(image)}@{digest}"


def split_pinned(ref: str) -> tuple[str, str]:
    """`REPO@sha256:HEX` -> (REPO, digest); anything else is an InputError."""
    m = _PINNED.match(ref.strip())
    if not m:
        raise InputError(f"--image {ref!r}: give a pinned reference REPO@sha256:<64 hex digits>")
    return m["repo"], m["digest"]


DOCKER_HUB = "docker.io"


def distribution(image: str) -> tuple[str, str, str, str | None]:
    """`NAME[:TAG][@DIGEST]` -> (registry host, repository, tag, digest) as docker resolves a name (pure).

    The first path part is a registry only when it has a `.` or a `:` or is `localhost`; otherwise the
    name is on Docker Hub, where a one-part name lives under `library/`. No tag means `latest`.
    """
    digest = digest_of(image)
    name = named(image)
    first, sep, rest = name.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        host, path = first, rest
    else:
        host, path = DOCKER_HUB, name
        if "/" not in path:
            path = f"library/{path}"
    tag = "latest"
    last = path.rsplit("/", 1)[-1]
    if ":" in last:
        path, tag = path.rsplit(":", 1)
    return host, path, tag, digest
