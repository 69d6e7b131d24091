"""`stackbuild lock`: resolve, find the native wheels, audit them, check, then write lock and audit together.

Beside them it writes what else the lock fixes: the source stages' hash-pinned build tools
(STACK.build-tools.txt, with each source.ref resolved to its commit in the lock's header) and the
pinned sglang release's flag table (sglang-VERSION.flags.json), so `validate --offline` works from
a fresh clone.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from stackbuild.errors import Finding, InputError, SpecError
from stackbuild.spec import sglang
from stackbuild.spec.load import positions
from stackbuild.spec.lock import audit as auditmod
from stackbuild.spec.lock import base, check, resolve, source, wheels
from stackbuild.spec.lock.resolve import Lock
from stackbuild.spec.lock.target import Target, audit_path, build_lock_path, lock_command, lock_path, target_of
from stackbuild.spec.sglang_table import Table
from stackbuild.spec.stack import Stack


@dataclass
class Result:
    text: str
    lock: Lock
    audits: dict[str, auditmod.WheelAudit]
    findings: list[Finding]
    lock_file: Path
    audit_file: Path
    tools_file: Path
    tools_text: str | None = None  # the source stages' build tools, hash-pinned (None: no source builds)
    table: Table | None = None  # the pinned sglang release's flag table

    def redirect(self, out: Path) -> None:
        """Write the lock to `out`, everything else beside it."""
        self.lock_file, self.audit_file = out, out.with_suffix(".audit.json")
        self.tools_file = out.with_suffix(".build-tools.txt")


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


def _commits(stack: Stack, t: Target, offline: bool) -> dict[str, str]:
    """dist -> the commit each source build's ref names now (offline: as the committed lock recorded it)."""
    prev = resolve.commits(prev_lock.text) if (prev_lock := check.read_lock(stack)) else {}
    out = {}
    for (dist, repo, ref), comp in zip(t.sources, [n for n, c in stack.components.items() if c.source], strict=True):
        try:
            if offline and (dist, repo, ref) not in prev:
                raise InputError(f"{repo} {ref} is not in the committed lock; resolve it once without --offline")
            out[dist] = prev[(dist, repo, ref)] if offline else source.resolve_ref(repo, ref)
        except InputError as err:
            pos = positions(stack).pos(("components", comp, "source", "ref"))
            raise SpecError([Finding(pos.file, pos.line, pos.col, "error", str(err), "lock-source")]) from err
    return out


def _base(stack: Stack, offline: bool, progress: Callable[[str], None],
          resolver: base.Resolver | None) -> base.BasePin:
    """The base image's digest as its registry names the tag now; offline, or where the registry does not
    answer, the committed lock's pin of the same name, else unpinned (the line says why)."""
    prev = check.read_lock(stack)
    try:
        pin, note = base.resolve(stack.base_image, base.parse(prev.text) if prev else None, offline=offline,
                                  tag_digest=resolver)
    except InputError as err:
        pos = positions(stack).pos(("base_image",))
        raise SpecError([Finding(pos.file, pos.line, pos.col, "error", str(err), "base-image-digest")]) from err
    progress(note)
    return pin


def _tools(stack: Stack, t: Target, offline: bool) -> str | None:
    """The source stages' build tools and their dependencies, hash-pinned, resolved apart from the closure."""
    if not t.build_tools:
        return None
    head = (
        f"# stackbuild build-tools lock for {stack.name}; do not edit, regenerate with `{lock_command(stack)}`\n"
        f"# inputs-sha256: {t.inputs_hash()}\n"
        f"# what each source stage installs before its build: {' '.join(t.build_tools)}\n"
    )
    return resolve.seal(head + resolve.resolve(t.tools_target(), offline=offline))


def _table(stack: Stack, offline: bool) -> Table | None:
    v = stack.sglang_version
    if v is None:
        return None
    return sglang.known_table(v, stack.root) if offline else sglang.table_of_wheel(v)


def lock_stack(stack: Stack, *, offline: bool = False, progress: Callable[[str], None] = lambda _: None,
               base_digest: base.Resolver | None = None) -> Result:
    """`base_digest` asks the base image's registry (the CLI hands in stackbuild.image.registry.base_digest);
    without it the base is pinned only by the spec or the committed lock."""
    t = target_of(stack)
    if t is None:
        raise SpecError(check.freshness(stack, None, None) or [])
    progress(f"resolving {' '.join(t.requirements)} for python {t.python} on {t.platform}")
    try:
        body = resolve.resolve(t, offline=offline)
    except resolve.Unsatisfiable as err:
        raise SpecError([check.unsatisfiable_finding(stack, err.reason, err.about_python)]) from err
    lock = resolve.parse(body)
    commits = _commits(stack, t, offline)
    for (dist, repo, ref) in t.sources:
        progress(f"{dist}: {repo} {ref} is {commits[dist]}")
    pin = _base(stack, offline, progress, base_digest)
    tools = _tools(stack, t, offline)
    if offline:
        natives, audits = _audits_offline(stack, lock)
    else:
        files = _natives_online(lock, t)
        natives = sorted(files)
        committed = check.committed_audits(stack)  # an audit of the same file (sha256) counts like a cached one
        audits = {}
        for i, n in enumerate(natives, 1):
            w = files[n]
            progress(f"auditing {i}/{len(natives)} {w.name}")
            known = committed.get(n)
            audits[n] = known if known is not None and known.sha256 == w.sha256 else auditmod.audit_cached(
                w.sha256, w.name, lambda w=w: wheels.fetch(w)  # type: ignore[misc]
            )
    text = resolve.seal(resolve.header(t, stack.name, natives, commits, base=pin) + body)
    lock = resolve.parse(text)
    findings = check.cuda_packages(stack, lock) + check.audit_findings(stack, lock, audits)
    findings += check.unaudited(stack, lock, audits)
    return Result(
        text, lock, audits, findings, lock_path(stack), audit_path(stack), build_lock_path(stack), tools,
        _table(stack, offline),
    )


def write(result: Result) -> list[Path]:
    """Every file, each by temp name and rename; the lock last, so a lock on disk has its companions."""
    if any(f.severity == "error" for f in result.findings):
        raise InputError("refusing to write a lock with errors")
    resolve.write(result.audit_file, auditmod.dump_committed(result.audits))
    written = [result.audit_file]
    if result.tools_text is not None:
        resolve.write(result.tools_file, result.tools_text)
        written.append(result.tools_file)
    if result.table is not None:
        written.append(sglang.write_table(result.table, result.lock_file.parent))
    resolve.write(result.lock_file, result.text)
    return [result.lock_file, *written]


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
