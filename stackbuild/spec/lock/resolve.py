"""Resolve a Target with uv and read/write the hash-pinned requirements lock.

uv's `pip compile` resolves for a foreign target (`--python-version`,
`--python-platform`) without installing anything; `--generate-hashes` pins every
file, `--emit-index-annotation` records the index each came from.
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from stackbuild.effects import proc
from stackbuild.errors import InfraError, InputError
from stackbuild.spec.lock.base import BasePin
from stackbuild.spec.lock.base import line as base_line
from stackbuild.spec.lock.target import Target

HEADER = "# stackbuild lock"
_INPUTS_RE = re.compile(r"^# inputs-sha256: ([0-9a-f]{64})$", re.MULTILINE)
_CONTENT_RE = re.compile(r"^# content-sha256: ([0-9a-f]{64})\n", re.MULTILINE)
_REQ_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+?)(?:\s*;.*)?\s*\\?$")
_HASH_RE = re.compile(r"--hash=sha256:([0-9a-f]{64})")
_BASE_LINE_RE = re.compile(r"^# base image: .*$", re.MULTILINE)


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Entry:
    name: str  # canonical
    version: str
    line: int  # 1-based line of `name==version` in the lock file
    hashes: list[str] = field(default_factory=list)
    index: str | None = None
    via: list[str] = field(default_factory=list)  # canonical parents; "-r" for a top-level requirement


@dataclass
class Lock:
    text: str
    inputs_hash: str | None
    entries: dict[str, Entry]
    content_hash: str | None = None  # what the header says the resolved part hashed to when it was written

    def edited(self) -> str | None:
        """Why the resolved part is not what `lock` wrote (hand-edited, or written without a content hash)."""
        if self.content_hash is None:
            return "has no content-sha256 in its header (not written by this stackbuild)"
        have = content_hash(self.text)
        if have != self.content_hash:
            return (f"was edited after it was resolved (its pins hash to {have[:12]}, "
                    f"its header says {self.content_hash[:12]})")
        return None

    def roots(self, name: str, tops: set[str]) -> list[str]:
        """The nearest top-level requirements (components) whose closure brought `name` in."""
        seen, level = {name}, [name]
        while level:
            found = sorted(n for n in level if n in tops)
            if found:
                return found
            nxt = []
            for n in level:
                e = self.entries.get(n)
                for p in e.via if e else []:
                    if p not in seen and p != "-r":
                        seen.add(p)
                        nxt.append(p)
            level = nxt
        return []


class Unsatisfiable(InputError):
    """uv proved the requirements cannot all hold for the target; the message is uv's own reason."""

    def __init__(self, reason: str, about_python: bool) -> None:
        self.reason, self.about_python = reason, about_python
        super().__init__(reason)


def unsatisfiable(stderr: str) -> Unsatisfiable | None:
    """uv's 'No solution found' as one line (its cause and hint), else None (pure)."""
    if "No solution found" not in stderr:
        return None
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    reason = " ".join(ln.removeprefix("cause: ").removeprefix("hint: ") for ln in lines[1:]) or lines[0]
    return Unsatisfiable(reason, "Python" in reason)


def uv_argv(t: Target, requirements: Path, constraints: Path | None, out: Path, *, offline: bool) -> list[str]:
    argv = [sys.executable, "-m", "uv", "pip", "compile", str(requirements), "-o", str(out), "--quiet"]
    argv += ["--python-version", t.python, "--python-platform", t.platform]
    argv += ["--generate-hashes", "--emit-index-annotation", "--emit-index-url", "--no-header", "--no-build"]
    # --no-build means no interpreter of the target version is needed; never fetch one
    argv += ["--no-python-downloads"]
    argv += ["--index-url", t.index_url]
    for url in t.extra_index_urls:
        argv += ["--extra-index-url", url]
    if t.exclude_newer:
        argv += ["--exclude-newer", t.exclude_newer]
    if constraints is not None:
        argv += ["--constraint", str(constraints)]
    for dist in t.source_dists:
        argv += ["--no-emit-package", dist]
    if offline:
        argv.append("--offline")
    return argv


def header(t: Target, stack_name: str, native: list[str], commits: dict[str, str] | None = None,
           base: BasePin | None = None) -> str:
    """The lock's header; `commits` (dist -> commit) are the source builds' refs resolved at lock time; `base`
    the base image the closure is installed on: its digest, or why it is unpinned."""
    built = ", ".join(t.source_built) or "none"
    sources = "".join(f"# source: {d} {repo} {ref} {(commits or {}).get(d, '?')}\n" for d, repo, ref in t.sources)
    if base is not None:
        sources = base_line(base, stack_name) + sources
    return (
        f"{HEADER} for {stack_name}; do not edit, regenerate with `stackbuild lock {stack_name}`\n"
        f"# inputs-sha256: {t.inputs_hash()}\n"
        f"# target: python {t.python}, {t.platform}" + (f", as of {t.exclude_newer}" if t.exclude_newer else "") + "\n"
        f"# built from source in the image, installed from its build stage (not from this file): {built}\n"
        f"# native: {' '.join(native) or '-'}\n"
    ) + sources


def body_of(text: str) -> str:
    """The resolved part of a lock: everything after its leading comment lines (the header)."""
    lines = text.splitlines(keepends=True)
    i = next((n for n, ln in enumerate(lines) if not ln.startswith("#")), len(lines))
    return "".join(lines[i:])


def content_hash(text: str) -> str:
    """sha256 of a lock's resolved part (what uv wrote: every pin, hash and annotation) and of its base image
    line, when it has one (the digest FROM carries): a hand edit of either is caught."""
    m = _BASE_LINE_RE.search(text)
    pinned = m.group(0) + "\n" if m else ""
    return hashlib.sha256((pinned + body_of(text)).encode("utf-8")).hexdigest()


def seal(text: str) -> str:
    """The lock with its header recording its content's hash, after the inputs' (one line, replaced if there)."""
    text = _CONTENT_RE.sub("", text)
    line = f"# content-sha256: {content_hash(text)}\n"
    m = _INPUTS_RE.search(text)
    at = text.index("\n", m.end()) + 1 if m else 0
    return text[:at] + line + text[at:]


_SOURCE_RE = re.compile(r"^# source: (\S+) (\S+) (\S+) ([0-9a-f]{40})$", re.MULTILINE)


def commits(text: str) -> dict[tuple[str, str, str], str]:
    """(dist, repo, ref) -> commit, from a lock's `# source:` lines (pure)."""
    return {(d, repo, ref): sha for d, repo, ref, sha in _SOURCE_RE.findall(text)}


def resolve(t: Target, *, offline: bool = False) -> str:
    """uv's hash-pinned output for `t` (the lock without its header)."""
    with tempfile.TemporaryDirectory(prefix="stackbuild-lock-") as tmp:
        d = Path(tmp)
        (d / "requirements.in").write_text("\n".join(t.requirements) + "\n")
        cons = None
        if t.constraints:
            cons = Path("constraints.txt")
            (d / cons).write_text("\n".join(t.constraints) + "\n")
        # relative names, run inside the temp dir: uv writes `# via -r requirements.in` into the lock,
        # and a temp path there would make every resolution a different file
        argv = uv_argv(t, Path("requirements.in"), cons, Path("lock.txt"), offline=offline)
        done = proc.run(argv, cwd=d, check=False, timeout=900, what="resolving with uv")
        if done.returncode != 0:
            refused = unsatisfiable(done.stderr)
            if refused is not None:
                raise refused
            raise InfraError(
                "uv could not resolve " + " ".join(t.requirements) + f" for python {t.python} on {t.platform}",
                command=done.command,
                returncode=done.returncode,
                output=done.stderr or done.stdout,
            )
        body = (d / "lock.txt").read_text()
    return body


def parse(text: str) -> Lock:
    m = _INPUTS_RE.search(text)
    entries: dict[str, Entry] = {}
    cur: Entry | None = None
    in_via = False
    for i, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        rm = _REQ_RE.match(raw)
        if rm:
            cur = Entry(canon(rm.group(1)), rm.group(2), i)
            entries[cur.name] = cur
            in_via = False
            continue
        if cur is None:
            continue
        if line.startswith("--hash="):
            cur.hashes += _HASH_RE.findall(line)
        elif line.startswith("# from "):
            cur.index = line.removeprefix("# from ").strip()
            in_via = False
        elif line == "# via":
            in_via = True
        elif line.startswith("# via "):
            cur.via.append(_via_name(line.removeprefix("# via ")))
        elif in_via and line.startswith("#   "):
            cur.via.append(_via_name(line.removeprefix("#   ")))
    c = _CONTENT_RE.search(text)
    return Lock(text, m.group(1) if m else None, entries, c.group(1) if c else None)


def _via_name(s: str) -> str:
    s = s.strip()
    return "-r" if s.startswith("-r ") else canon(s.split()[0])


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.fchmod(fd, 0o644)  # a file to commit and share, not mkstemp's private 0600
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)
