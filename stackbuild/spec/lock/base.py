"""The base image in the lock: pinned by its registry's digest where that registry answers, else said unpinned.

`lock` asks the registry what the spec's tag names now (HEAD /v2/REPO/manifests/TAG -> Docker-Content-Digest,
through stackbuild.image.registry.base_digest, which the CLI hands in: the registry sits above the spec) and
writes `# base image: NAME:TAG@sha256:D` into the lock's header, which its content hash covers; the rendered
FROM then carries that digest, and `build` refuses a base whose tag has moved since. A registry that does not
answer (Docker Hub and nvcr.io from these machines), `--offline`, or a `local/` image leave the line saying
why the base is unpinned; the committed pin of the same name is kept instead when there is one. A base the
spec itself pins (`NAME@sha256:D`) is recorded as the spec says.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from stackbuild.errors import InputError

_LINE_RE = re.compile(r"^# base image: (?P<name>[^\s@]+)(?:@(?P<digest>sha256:[0-9a-f]{64}))?"
                      r"(?: \(unpinned: (?P<why>.*)\))?$", re.MULTILINE)
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
LOCAL_PREFIX = "local/"  # images made on this machine (scripts/infra/up.sh), in no registry
# What asks a registry (stackbuild.image.registry.base_digest, handed in by the CLI: the registry sits above
# the spec): NAME:TAG -> the digest it names now, None when the registry has no such tag; Unanswered when
# the registry cannot be asked.
Resolver = Callable[[str], "str | None"]


class Unanswered(Exception):
    """The base's registry could not say what its tag names; `why` is one short, stable phrase for the lock."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def named(image: str) -> str:
    """The reference without its digest: `NAME[:TAG]` as a spec or a lock writes it (pure)."""
    return image.split("@", 1)[0]


def digest_of(image: str) -> str | None:
    """The `sha256:` digest a reference pins, or None for one named by tag only (pure)."""
    _, sep, digest = image.partition("@")
    if not sep:
        return None
    if not _DIGEST_RE.match(digest):
        raise InputError(f"image {image!r}: a digest is sha256:<64 hex digits>")
    return digest


@dataclass(frozen=True)
class BasePin:
    name: str  # NAME[:TAG] as the spec writes it, without a digest
    digest: str | None  # the registry's manifest digest the lock pins, None when unpinned
    why: str | None = None  # unpinned: why (one short, stable phrase)

    @property
    def reference(self) -> str:
        """What FROM names: NAME:TAG@sha256:D (docker builds exactly D; the tag stays for the reader)."""
        return f"{self.name}@{self.digest}" if self.digest else self.name


def line(pin: BasePin, stack_name: str) -> str:
    """The lock's header line for the base (pure)."""
    if pin.digest:
        return f"# base image: {pin.reference}\n"
    return (f"# base image: {pin.name} (unpinned: {pin.why or 'a tag, not a digest'}; "
            f"`stackbuild validate {stack_name}` says how to pin it)\n")


def parse(text: str) -> BasePin | None:
    """The base a lock's header records, or None for a lock without the line (pure)."""
    m = _LINE_RE.search(text)
    if m is None:
        return None
    why = m["why"].split(";", 1)[0] if m["why"] else None
    return BasePin(m["name"], m["digest"], why)


def agrees(pin: BasePin | None, base_image: str) -> bool:
    """Whether a lock's base record was made for this spec's base_image (its name, and its digest if it pins one)."""
    if pin is None:
        return True  # a lock from before the line: nothing recorded to disagree with
    spec_digest = digest_of(base_image)
    return pin.name == named(base_image) and (spec_digest is None or pin.digest == spec_digest)


def pinned_reference(base_image: str, locked: BasePin | None) -> str:
    """What FROM names: the spec's base, with the lock's digest when the lock pinned this very base (pure)."""
    if digest_of(base_image) is None and locked is not None and locked.digest and agrees(locked, base_image):
        return locked.reference
    return base_image


def resolve(base_image: str, previous: BasePin | None, *, offline: bool,
            tag_digest: Resolver | None) -> tuple[BasePin, str]:
    """The base's pin for a new lock, and a line saying how it was found; InputError when the registry
    answers that it has no such tag. Without a resolver (or offline) no registry is asked."""
    name, digest = named(base_image), digest_of(base_image)
    if digest is not None:
        return BasePin(name, digest), f"base image {name} is pinned by the spec ({digest})"
    kept = previous if previous is not None and previous.digest and previous.name == name else None
    if name.startswith(LOCAL_PREFIX):
        return BasePin(name, None, "a local image, in no registry"), f"base image {name} is local: unpinned"
    if offline or tag_digest is None:
        if previous is not None and previous.name == name:  # what the committed lock found, pinned or not
            return previous, f"base image {name}: not asked offline; as the committed lock recorded it"
        why = "locked offline"
    else:
        try:
            found = tag_digest(name)
        except Unanswered as err:
            why = err.why
        else:
            if found is None:
                raise InputError(f"base_image: its registry has no {name}; name a tag that exists")
            return BasePin(name, found), f"base image {name} is {found}"
    if kept is not None:
        return kept, f"base image {name}: {why}; keeping the committed lock's {kept.digest}"
    return BasePin(name, None, why), f"base image {name} is unpinned: {why}"
