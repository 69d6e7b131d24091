"""BuildKit through a docker CLI: which CLI, the exact argv, and a streamed run.

The Docker Engine SDK builds only with the legacy builder (no cache mounts, no
secrets), so builds go through a CLI that has BuildKit: `docker buildx build`
when the buildx plugin is there, else a CLI older than 23.0 whose BuildKit is
built in (`DOCKER_BUILDKIT=1 docker build`). Newer CLIs without buildx refuse.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from stackbuild.effects import proc
from stackbuild.errors import InfraError

CANDIDATE_CLIS = ("docker", "/usr/bin/docker", "/usr/local/bin/docker")
_VERSION_RE = re.compile(r"version (\d+)\.(\d+)")


@dataclass(frozen=True)
class CliProbe:
    path: str
    version: tuple[int, int] | None
    has_buildx: bool


@dataclass(frozen=True)
class Builder:
    """A docker CLI that can run BuildKit builds, and how."""

    cli: str
    buildx: bool
    version: tuple[int, int] | None

    @property
    def description(self) -> str:
        v = ".".join(map(str, self.version)) if self.version else "?"
        how = "buildx plugin" if self.buildx else "built-in BuildKit (DOCKER_BUILDKIT=1)"
        return f"{self.cli} {v} with {how}"

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        return {**base, "DOCKER_BUILDKIT": "1"}


def parse_cli_version(text: str) -> tuple[int, int] | None:
    m = _VERSION_RE.search(text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def choose_builder(probes: Sequence[CliProbe]) -> Builder:
    """Prefer buildx; else a pre-23 CLI (built-in BuildKit). Pure: probes come from `probe_clis`."""
    for p in probes:
        if p.has_buildx:
            return Builder(p.path, True, p.version)
    for p in probes:
        if p.version is not None and p.version < (23, 0):
            return Builder(p.path, False, p.version)
    seen = ", ".join(f"{p.path} {p.version}" for p in probes) or "none on PATH"
    raise InfraError(
        "no docker CLI with BuildKit found (need the buildx plugin, or a docker CLI < 23 such as "
        f"Debian's docker.io at /usr/bin/docker; saw: {seen}); install docker.io or docker-buildx"
    )


def probe_clis(candidates: Sequence[str] = CANDIDATE_CLIS) -> list[CliProbe]:
    seen: set[str] = set()
    out: list[CliProbe] = []
    for c in candidates:
        path = shutil.which(c)
        if not path or os.path.realpath(path) in seen:
            continue
        seen.add(os.path.realpath(path))
        ver = proc.quiet([path, "--version"])
        bx = proc.quiet([path, "buildx", "version"])
        out.append(CliProbe(path, parse_cli_version(ver or ""), bx is not None and "buildx" in bx.lower()))
    return out


_BUILDER: list[Builder] = []


def find_builder() -> Builder:
    if not _BUILDER:
        _BUILDER.append(choose_builder(probe_clis()))
    return _BUILDER[0]


@dataclass(frozen=True)
class BuildRequest:
    context: Path
    tag: str
    labels: Mapping[str, str] = field(default_factory=dict)
    build_args: Mapping[str, str] = field(default_factory=dict)
    secrets: Mapping[str, Path] = field(default_factory=dict)  # id -> file holding the value
    cache_from: tuple[str, ...] = ()
    cache_to: str | None = None
    no_cache: bool = False
    progress: str = "plain"
    iidfile: Path | None = None
    target: str | None = None


def build_argv(b: Builder, r: BuildRequest) -> list[str]:
    """The exact command line for one build (pure)."""
    argv = [b.cli, "buildx", "build", "--load"] if b.buildx else [b.cli, "build"]
    argv += ["--progress", r.progress, "--network", "host", "--file", str(r.context / "Dockerfile")]
    argv += ["--tag", r.tag]
    if r.target:
        argv += ["--target", r.target]
    for k in sorted(r.labels):
        argv += ["--label", f"{k}={r.labels[k]}"]
    for k in sorted(r.build_args):
        argv += ["--build-arg", f"{k}={r.build_args[k]}"]
    for sid in sorted(r.secrets):
        argv += ["--secret", f"id={sid},src={r.secrets[sid]}"]
    if r.no_cache:
        argv.append("--no-cache")
    for ref in r.cache_from:
        argv += ["--cache-from", f"type=registry,ref={ref}" if b.buildx else ref]
    if r.cache_to:
        if b.buildx:
            argv += ["--cache-to", f"type=registry,ref={r.cache_to},mode=max"]
        else:
            # Without buildx there is no registry cache exporter: inline cache metadata rides
            # in the pushed image (final stage only) and --cache-from reads it back.
            argv += ["--build-arg", "BUILDKIT_INLINE_CACHE=1"]
    if r.iidfile:
        argv += ["--iidfile", str(r.iidfile)]
    argv.append(str(r.context))
    return argv


# --- streaming ------------------------------------------------------------------------

_STEP_RE = re.compile(r"^#(\d+) \[(?:(?P<stage>[\w.-]+) )?(?P<i>\d+)/(?P<n>\d+)\]")
_DONE_RE = re.compile(r"^#(\d+) (DONE|CACHED|ERROR)")


class StageProgress:
    """Turns BuildKit plain lines into per-stage progress: stage -> (steps done, steps total)."""

    def __init__(self) -> None:
        self.stages: dict[str, list[int]] = {}
        self._vertex: dict[str, str] = {}

    def feed(self, line: str) -> str | None:
        """Returns the stage whose progress changed, if any."""
        m = _STEP_RE.match(line)
        if m:
            stage = m.group("stage") or "build"
            self._vertex[m.group(1)] = stage
            st = self.stages.setdefault(stage, [0, int(m.group("n"))])
            st[1] = int(m.group("n"))
            return None
        d = _DONE_RE.match(line)
        if d and d.group(1) in self._vertex:
            stage = self._vertex.pop(d.group(1))
            self.stages[stage][0] += 1
            return stage
        return None


def stream_build(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    log_path: Path,
    timeout: float,
    on_line: Callable[[str], None] | None = None,
) -> None:
    """Run the build, write every output line to `log_path`, raise InfraError naming it on failure."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        log.write(f"$ {shlex.join(argv)}\n")
        log.flush()
        try:
            done = proc.stream(argv, env=env, log=log, timeout=timeout, on_line=on_line, what="build")
        except InfraError as err:
            err.log_path = str(log_path)
            raise
    if done.returncode != 0:
        raise InfraError(
            f"build failed {summarize_failure(list(done.tail))}",
            command=shlex.join(argv),
            returncode=done.returncode,
            output="".join(done.tail),
            log_path=str(log_path),
        )


_STEP_FAILED_RE = re.compile(r"^ ?> \[([^\]]+)\]")
_CAUSE_WORDS = "E: |error|Error|ERROR|fatal|No such|not found|cannot|denied|failed|nonexistent"
_CAUSE_RE = re.compile(rf"^#\d+ \d+\.\d+ (.*(?:{_CAUSE_WORDS}).*)$")
_EXIT_RE = re.compile(r"exit code: (\d+)")
# apt writes its error's letter and ": message" to stderr in two writes. While its stdout has a
# progress line open, BuildKit's merged stream ends that line with the letter and gives the
# message a line of its own, maybe after more progress lines (a CI run: "#5 3.285 Building
# dependency tree...E", "#5 3.809 Reading state information...", "#5 3.820 : Unable to locate
# package ..."); the letter goes back in front of its message
_LETTER_LEFT_RE = re.compile(r"^(#(\d+) \d+\.\d+ .*\.\.\.)([EW])$")
_MESSAGE_RE = re.compile(r"^(#(\d+) \d+\.\d+ ): (.*)$")
# or both writes land on the open progress line ("#5 2.866 Building dependency tree...E: Unable to
# locate package ...", a CI run): the message keeps its own line, the progress text is dropped
_ON_PROGRESS_RE = re.compile(r"^(#\d+ \d+\.\d+ ).*\.\.\.([EW]: .*)$")


def _unsplit(tail: list[str]) -> list[str]:
    lines = [ln.rstrip("\n") for ln in tail]
    letters: dict[str, str] = {}  # step -> the letter its progress line was left with
    for i, ln in enumerate(lines):
        if left := _LETTER_LEFT_RE.match(ln):
            lines[i], letters[left.group(2)] = left.group(1), left.group(3)
        elif (msg := _MESSAGE_RE.match(ln)) and msg.group(2) in letters:
            lines[i] = f"{msg.group(1)}{letters.pop(msg.group(2))}: {msg.group(3)}"
        elif joined := _ON_PROGRESS_RE.match(ln):
            lines[i] = joined.group(1) + joined.group(2)
    return lines


def summarize_failure(tail: list[str]) -> str:
    """`at [stage i/n] (exit code N): <the step's own last error line>` (pure)."""
    tail = _unsplit(tail)
    step = next((m.group(1) for ln in tail if (m := _STEP_FAILED_RE.match(ln))), None)
    causes = [m.group(1).strip() for ln in tail if (m := _CAUSE_RE.match(ln.rstrip()))]
    code = next((m.group(1) for ln in reversed(tail) if (m := _EXIT_RE.search(ln))), None)
    parts = [f"at [{step}]" if step else "", f"(exit code {code})" if code else ""]
    head = " ".join(p for p in parts if p)
    cause = causes[-1][:200] if causes else next((ln.strip()[:200] for ln in tail if "ERROR" in ln), "see the log")
    return f"{head}: {cause}" if head else cause

