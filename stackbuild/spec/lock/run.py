"""`stackbuild lock`: resolve, find the native wheels, audit them, check, then write lock and audit together."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from stackbuild.errors import Finding, InputError, SpecError
from stackbuild.spec.lock import audit as auditmod
from stackbuild.spec.lock import check, resolve, wheels
from stackbuild.spec.lock.resolve import Lock
from stackbuild.spec.lock.target import Target, audit_path, lock_path, target_of
from stackbuild.spec.stack import Stack


@dataclass
class Result:
    text: str
    lock: Lock
    audits: dict[str, auditmod.WheelAudit]
    findings: list[Finding]
    lock_file: Path
    audit_file: Path


def _natives_online(lock: Lock, t: Target) -> dict[str, wheels.WheelFile]:
    def one(name: str) -> tuple[str, wheels.WheelFile]:
        return name, wheels.locate(lock.entries[name], t)

    with ThreadPoolExecutor(max_workers=8) as pool:
        found = dict(pool.map(one, sorted(lock.entries)))
    return {n: w for n, w in found.items() if w.native}


def _audits_offline(stack: Stack, lock: Lock) -> tuple[list[str], dict[str, auditmod.WheelAudit]]:
    """Natives from the committed lock; audits from the committed file or the cache, by locked sha256."""
    prev = check.read_lock(stack)
    natives = [n for n in (check.native_names(prev) if prev else []) if n in lock.entries]
    committed = check.committed_audits(stack)
    audits = {}
    for n in natives:
        hashes = lock.entries[n].hashes
        a = committed.get(n)
        if a is None or a.sha256 not in hashes:
            a = next((c for h in hashes if (c := auditmod.cached_audit(h)) is not None), None)
        if a is not None:
            audits[n] = a
    return natives, audits


def lock_stack(stack: Stack, *, offline: bool = False, progress: Callable[[str], None] = lambda _: None) -> Result:
    t = target_of(stack)
    if t is None:
        raise SpecError(check.freshness(stack, None, None) or [])
    progress(f"resolving {' '.join(t.requirements)} for python {t.python} on {t.platform}")
    try:
        body = resolve.resolve(t, offline=offline)
    except resolve.Unsatisfiable as err:
        raise SpecError([check.unsatisfiable_finding(stack, err.reason, err.about_python)]) from err
    lock = resolve.parse(body)
    if offline:
        natives, audits = _audits_offline(stack, lock)
    else:
        files = _natives_online(lock, t)
        natives = sorted(files)
        audits = {}
        for i, n in enumerate(natives, 1):
            w = files[n]
            progress(f"auditing {i}/{len(natives)} {w.name}")
            audits[n] = auditmod.audit_cached(w.sha256, w.name, lambda w=w: wheels.fetch(w))  # type: ignore[misc]
    text = resolve.header(t, stack.name, natives) + body
    lock = resolve.parse(text)
    findings = check.cuda_packages(stack, lock) + check.audit_findings(stack, lock, audits)
    findings += check.unaudited(stack, lock, audits)
    return Result(text, lock, audits, findings, lock_path(stack), audit_path(stack))


def write(result: Result) -> None:
    if any(f.severity == "error" for f in result.findings):
        raise InputError("refusing to write a lock with errors")
    resolve.write(result.audit_file, auditmod.dump_committed(result.audits))
    resolve.write(result.lock_file, result.text)


def table(stack: Stack, r: Result) -> list[str]:
    """A short per-stack summary: wheels audited, CUDA majors linked, arches covered."""
    majors: dict[int, int] = {}
    for a in r.audits.values():
        for m in a.cuda_majors:
            majors[m] = majors.get(m, 0) + 1
    gpu = [a for a in r.audits.values() if a.sass or a.ptx]
    rows = [
        f"{stack.name}: {len(r.lock.entries)} locked, {len(r.audits)} native wheel(s) audited, "
        f"{len(gpu)} carry GPU code",
        "  CUDA majors linked: " + (", ".join(f"{m} ({n} wheels)" for m, n in sorted(majors.items())) or "none"),
    ]
    for arch in stack.arches:
        n = auditmod.arch_number(arch)
        if n is None:
            continue
        with_sass = sum(1 for a in gpu if any(s // 10 == n // 10 and s <= n for s in a.sass))
        ptx_only = sum(1 for a in gpu if auditmod.covers(a, n)) - with_sass
        neither = len(gpu) - with_sass - ptx_only
        rows.append(f"  {arch}: SASS in {with_sass}, PTX only in {ptx_only}, neither in {neither}")
    for name, a in sorted(r.audits.items()):
        if a.sass or a.ptx or a.cuda_links:
            links = ",".join(sorted(a.cuda_links)) or "-"
            sass = ",".join(str(s) for s in a.sass) or "-"
            ptx = ",".join(str(p) for p in a.ptx) or "-"
            rows.append(f"    {name:<32} links {links:<40} sass {sass:<28} ptx {ptx}")
    return rows
