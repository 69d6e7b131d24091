"""Findings from a stack's lock and its audit, each located at the YAML line that brought the package in."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from stackbuild.errors import Finding
from stackbuild.spec import sglang
from stackbuild.spec.components import COMPONENTS, dist_of
from stackbuild.spec.facts import NCCL_ISSUES, driver_floor
from stackbuild.spec.load import positions
from stackbuild.spec.lock import audit as auditmod
from stackbuild.spec.lock import base
from stackbuild.spec.lock.resolve import Lock, canon, parse
from stackbuild.spec.lock.target import Target, audit_path, build_lock_path, lock_command, lock_path, target_of
from stackbuild.spec.stack import Stack

_CU_SUFFIX = re.compile(r"-cu(\d{2})$")
# Distributions whose own major version is the CUDA major they carry.
_CUDA_VERSIONED = ("nvidia-cuda-runtime", "cuda-toolkit", "cuda-python", "cuda-bindings")


def cuda_major_of_package(name: str, version: str) -> int | None:
    """The CUDA major a distribution is built for, from its name or version alone (pure)."""
    m = _CU_SUFFIX.search(name)
    if m:
        return int(m.group(1))
    if name in _CUDA_VERSIONED:
        return int(version.split(".")[0])
    return None


# Toolkit pieces whose version is the CUDA release they come from (12.8.93 is CUDA 12.8).
# nvidia-cuda-cccl (CUB/Thrust/libcu++ headers) too: code built against 13.3's headers in a 13.0 image
# mixes toolkit minors the way the compiler pieces do.
_TOOLKIT = ("nvidia-cuda-nvcc", "nvidia-nvjitlink", "nvidia-nvvm", "nvidia-cuda-crt", "nvidia-cuda-runtime",
            "nvidia-cuda-nvrtc", "nvidia-cuda-cccl")  # fmt: skip


def toolkit_release(name: str, version: str) -> tuple[int, int] | None:
    """(major, minor) of a CUDA toolkit piece, from its version (pure)."""
    if _CU_SUFFIX.sub("", name) not in _TOOLKIT:
        return None
    parts = version.split(".")
    return (int(parts[0]), int(parts[1])) if len(parts) > 1 and parts[1].isdigit() else None


def _floor_text(major: int, cuda: str | None = None) -> str:
    """The driver floor of a CUDA major's first release, or of the stack's exact CUDA when given."""
    return f"driver >= {driver_floor(cuda or f'{major}.0')}"


@dataclass(frozen=True)
class Where:
    file: str
    line: int
    col: int


def _component_pos(stack: Stack, lock: Lock, dist: str) -> tuple[Where, str]:
    """Where the component that brought `dist` in is declared, and its name for the message."""
    loc = positions(stack)
    tops = {dist_of(n): n for n, _ in stack.components.items()}
    roots = lock.roots(dist, set(tops))
    comp = tops[roots[0]] if roots else None
    path: tuple[str, ...] = ("components", comp) if comp else ("components",)
    pos = loc.keys.get(path) or loc.pos(path)
    return Where(pos.file, pos.line, pos.col), (roots[0] if roots else "the closure")


def _finding(w: Where, severity: str, message: str, rule: str) -> Finding:
    return Finding(w.file, w.line, w.col, severity, message, rule)


def unsatisfiable_finding(stack: Stack, reason: str, about_python: bool) -> Finding:
    """uv's reason, at `python:` when it is about the interpreter, else at the components."""
    loc = positions(stack)
    path: tuple[str, ...] = ("python",) if about_python else ("components",)
    pos = loc.keys.get(path) or loc.pos(path)
    return Finding(pos.file, pos.line, pos.col, "error", f"no resolution: {reason}", "lock-unsatisfiable")


def read_lock(stack: Stack) -> Lock | None:
    p = lock_path(stack)
    if not p.is_file():
        return None
    st = p.stat()
    return _parsed(p, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=16)
def _parsed(path: Path, _mtime_ns: int, _size: int) -> Lock:
    """One parse per file version: validate reads the same lock for every variant."""
    return parse(path.read_text(encoding="utf-8"))


def freshness(stack: Stack, t: Target | None, lock: Lock | None) -> list[Finding]:
    loc = positions(stack)
    cmd = lock_command(stack)
    if t is None:
        if stack.server.engine == "sglang" and stack.components.items():
            pos = loc.pos(("base_image",))
            msg = (
                f"base_image: cannot tell the glibc of '{stack.base_image}' to resolve wheels for; "
                "set lock.platform (e.g. x86_64-manylinux_2_39)"
            )
            return [Finding(pos.file, pos.line, pos.col, "error", msg, "lock-platform")]
        return []
    pos = loc.keys.get(("components",)) or loc.pos(("components",))
    rel = f"stacks/locks/{lock_path(stack).name}"
    if lock is None:
        return [Finding(pos.file, pos.line, pos.col, "error", f"no lock {rel}; run `{cmd}`", "lock-missing")]
    if lock.inputs_hash != t.inputs_hash():
        msg = f"{rel} was resolved for other inputs (components, python, platform, indexes); run `{cmd}`"
        return [Finding(pos.file, pos.line, pos.col, "error", msg, "lock-stale")]
    if why := lock.edited():
        return [Finding(pos.file, pos.line, pos.col, "error", f"{rel} {why}; run `{cmd}`", "lock-stale")]
    if not base.agrees(pin := base.parse(lock.text), stack.base_image):
        at = loc.pos(("base_image",))
        msg = (f"{rel} was made for base image {pin.reference if pin else '?'}, the spec names {stack.base_image}; "
               f"run `{cmd}`")
        return [Finding(at.file, at.line, at.col, "error", msg, "lock-stale")]
    return pins_against_audit(stack, lock, committed_audits(stack))


def build_tools_fresh(stack: Stack, t: Target | None) -> list[Finding]:
    """A stack with source builds needs its build-tools lock, resolved for the same inputs."""
    if t is None or not t.build_tools:
        return []
    p = build_lock_path(stack)
    tools = parse(p.read_text(encoding="utf-8")) if p.is_file() else None
    have = tools.inputs_hash if tools else None
    edited = tools.edited() if tools and have == t.inputs_hash() else None
    if have == t.inputs_hash() and edited is None:
        return []
    pos = positions(stack).keys.get(("components",)) or positions(stack).pos(("components",))
    why = "is missing" if have is None else edited or "was resolved for other inputs"
    msg = f"stacks/locks/{p.name} (the source stages' hash-pinned build tools) {why}; run `{lock_command(stack)}`"
    return [Finding(pos.file, pos.line, pos.col, "error", msg, "lock-missing" if have is None else "lock-stale")]


def current(stack: Stack) -> list[Finding]:
    """`lock --check`, offline: the committed lock, its audit, its build tools and the release's flag
    table all still answer the spec's inputs."""
    t = target_of(stack)
    lock = read_lock(stack) if t is not None else None
    out = freshness(stack, t, lock) or build_tools_fresh(stack, t)
    if out or lock is None:
        return out
    out = unaudited(stack, lock, committed_audits(stack))
    if t is not None and not t.exclude_newer:
        loc = positions(stack)
        pos = loc.keys.get(("lock",)) or loc.keys.get(("components",)) or loc.pos(("components",))
        msg = ("lock.exclude_newer is not set: a relock resolves against today's index and may differ; "
               "set it to an instant before this lock was made")
        out.append(Finding(pos.file, pos.line, pos.col, "warning", msg, "lock-date"))
    v = stack.sglang_version
    if v and sglang.committed_table(v, stack.root) is None:
        pos = positions(stack).keys.get(("components", "sglang")) or positions(stack).pos(("components",))
        msg = (f"no stacks/locks/{sglang.table_name(v)} (sglang {v}'s flags and env, for `validate --offline`); "
               f"run `{lock_command(stack)}`")
        out.append(Finding(pos.file, pos.line, pos.col, "error", msg, "lock-table"))
    return out


def cuda_packages(stack: Stack, lock: Lock) -> list[Finding]:
    """Packages built for another CUDA major than the stack's (from names and versions).

    A newer major raises the driver floor above what preflight checks: an error. An older one runs
    under the newer driver but mixes CUDA runtimes in one process: a warning.
    """
    if not stack.cuda_mm:
        return []
    want = stack.cuda_mm[0]
    out = []
    for e in lock.entries.values():
        major = cuda_major_of_package(e.name, e.version)
        release = toolkit_release(e.name, e.version)
        if release and release[0] == want and release > stack.cuda_mm:
            w, root = _component_pos(stack, lock, e.name)
            msg = (
                f"{e.name}=={e.version} (pulled in by {root}) is from CUDA {release[0]}.{release[1]}, newer than the "
                f"stack's {stack.cuda}: what it builds as PTX cannot be JIT-compiled by a {stack.cuda} driver "
                f"(SASS runs under minor-version compatibility); pin it with lock.constraints"
            )
            out.append(_finding(w, "warning", msg, "lock-cuda-minor"))
        if major is None or major == want:
            continue
        w, root = _component_pos(stack, lock, e.name)
        what = f"{e.name}=={e.version} (pulled in by {root}) is a CUDA {major} package"
        if major > want:
            msg = (
                f"{what}, which needs {_floor_text(major)}; "
                f"this stack is CUDA {stack.cuda} ({_floor_text(want, stack.cuda)})"
            )
            out.append(_finding(w, "error", msg, "lock-cuda-major"))
        else:
            out.append(_finding(w, "warning", f"{what} in a CUDA {stack.cuda} stack", "lock-cuda-mixed"))
    return out


def audit_findings(stack: Stack, lock: Lock, audits: dict[str, auditmod.WheelAudit]) -> list[Finding]:
    out = []
    want = stack.cuda_mm[0] if stack.cuda_mm else None
    targets = [(a, n) for a in stack.arches if (n := auditmod.arch_number(a)) is not None]
    shipped = {lib for a in audits.values() for lib in a.provides}
    components = {e.dist for e in COMPONENTS}
    for name, a in sorted(audits.items()):
        e = lock.entries.get(canon(name))
        if e is None or a.sha256 not in e.hashes:
            continue
        w, root = _component_pos(stack, lock, e.name)
        # A component's own wheel failing is an error; a transitive one may never load or launch on
        # this path (torchao 0.9.0 ships sm_80/86/90 kernels only), so it is a warning.
        severity = "error" if e.name in components else "warning"
        for lib, major in a.cuda_links.items():
            if want is None or major == want:
                continue
            if major > want:
                msg = (
                    f"{a.wheel} (pulled in by {root}) links {lib}: CUDA {major}, {_floor_text(major)}; "
                    f"this stack is CUDA {stack.cuda} ({_floor_text(want, stack.cuda)})"
                )
                out.append(_finding(w, "error", msg, "audit-cuda-major"))
            elif lib not in shipped and f"{lib.rsplit('.', 1)[0]}.{want}" not in a.cuda_links:
                # (a wheel that links both majors ships one library per CUDA and loads the one that fits)
                msg = (
                    f"{a.wheel} (pulled in by {root}) links {lib}, which no wheel in the closure ships "
                    f"(a CUDA {want} base has .so.{want}): loading it fails with 'cannot open shared object'"
                )
                out.append(_finding(w, severity, msg, "audit-cuda-missing"))
        for arch, n in targets:
            if not auditmod.covers(a, n):
                have = ", ".join(auditmod.arch_name(s) for s in a.sass) or "none"
                ptx = ", ".join(f"compute_{p}" for p in a.ptx) or "none"
                msg = (
                    f"{a.wheel} (pulled in by {root}) has no {arch} SASS (has {have}) and no PTX it can JIT "
                    f"from (has {ptx}): 'no kernel image is available' at run time"
                )
                out.append(_finding(w, severity, msg, "audit-arch"))
    return out


def committed_audits(stack: Stack) -> dict[str, auditmod.WheelAudit]:
    p = audit_path(stack)
    st = p.stat() if p.is_file() else None
    return dict(_audits(p, st.st_mtime_ns if st else 0, st.st_size if st else 0))


@functools.lru_cache(maxsize=16)
def _audits(path: Path, _mtime_ns: int, _size: int) -> dict[str, auditmod.WheelAudit]:
    return auditmod.load_committed(path)


def unaudited(stack: Stack, lock: Lock, audits: dict[str, auditmod.WheelAudit]) -> list[Finding]:
    """Locked packages with a platform wheel but no audit of the locked file."""
    known = {canon(n) for n, a in audits.items() if (e := lock.entries.get(canon(n))) and a.sha256 in e.hashes}
    missing = sorted(n for n in native_names(lock) if n not in known)
    if not missing:
        return []
    loc = positions(stack)
    pos = loc.keys.get(("components",)) or loc.pos(("components",))
    return [
        Finding(
            pos.file,
            pos.line,
            pos.col,
            "error",
            f"{len(missing)} locked native wheel(s) not audited ({', '.join(missing[:3])}"
            f"{' ...' if len(missing) > 3 else ''}); run `{lock_command(stack)}`",
            "audit-missing",
        )
    ]


def pins_against_audit(stack: Stack, lock: Lock, audits: dict[str, auditmod.WheelAudit]) -> list[Finding]:
    """Each native pin against what the resolver's files were when audited (the committed audit records each
    file's name and sha256): a pin whose version or hashes no longer name the audited file was changed."""
    out = []
    for name in native_names(lock):
        e, a = lock.entries.get(name), audits.get(name)
        if e is None or a is None:
            continue  # a native name with no pin, or no audit: `unaudited` says so
        parts = a.wheel.removesuffix(".whl").split("-")  # NAME-VERSION(-BUILD)?-PY-ABI-PLATFORM (PEP 427)
        version = parts[1] if len(parts) >= 5 else e.version
        if a.sha256 in e.hashes and version == e.version:
            continue
        w, _ = _component_pos(stack, lock, e.name)
        msg = (f"{e.name}=={e.version} in {lock_path(stack).name} does not name the file the lock audited "
               f"({a.wheel}, sha256 {a.sha256[:12]}): the pin was changed after it was resolved; "
               f"run `{lock_command(stack)}`")
        out.append(_finding(w, "error", msg, "lock-stale"))
    return out


def nccl_of(lock: Lock) -> tuple[str, str] | None:
    """(distribution, version) of the NCCL the image carries (nvidia-nccl-cuXX, the one torch loads), if locked."""
    e = next((e for n, e in sorted(lock.entries.items()) if re.fullmatch(r"nvidia-nccl-cu\d+", n)), None)
    return (e.name, e.version) if e else None


def nccl_findings(stack: Stack, lock: Lock) -> list[Finding]:
    """The locked NCCL against the public bugs on the users' cards (facts.NCCL_ISSUES), for a TP stack on sm_120."""
    nccl = nccl_of(lock)
    if nccl is None or "sm_120" not in stack.arches or stack.runtime.tp < 2:
        return []
    name, version = nccl
    have = tuple(int(x) for x in re.findall(r"\d+", version)[:3])
    out = []
    for bug in NCCL_ISSUES:
        if have < bug.first or (bug.fixed is not None and have >= bug.fixed):
            continue
        w, root = _component_pos(stack, lock, name)
        fix = (f"; {'.'.join(map(str, bug.fixed))} is reported good: raise it with lock.constraints where "
               f"{root}'s own pin allows" if bug.fixed else "")
        out.append(_finding(w, "warning", f"{name}=={version} (pulled in by {root}), TP {stack.runtime.tp} on "
                                          f"sm_120: {bug.issue}: {bug.what}{fix}", "nccl-known-bug"))
    return out


def native_names(lock: Lock) -> list[str]:
    """Entries the audit file lists as native (recorded at lock time; a pure-Python wheel has none)."""
    marker = re.compile(r"^# native: (.+)$", re.MULTILINE)
    m = marker.search(lock.text)
    return sorted(canon(n) for n in m.group(1).split() if n != "-") if m else []


def check_lock(stack: Stack) -> list[Finding]:
    """What `validate` checks, from committed files only: fresh lock, CUDA majors, audit."""
    t = target_of(stack)
    lock = read_lock(stack) if t is not None else None
    out = freshness(stack, t, lock) + build_tools_fresh(stack, t)
    if out or lock is None:
        return out
    audits = committed_audits(stack)
    return (cuda_packages(stack, lock) + audit_findings(stack, lock, audits) + unaudited(stack, lock, audits)
            + nccl_findings(stack, lock))
