"""Binary audit of a locked closure: per native wheel, the CUDA majors it links and the GPU arches it carries.

Facts are read from the wheel's bytes (stackbuild.spec.lock.elf) and kept per wheel
sha256: in the user cache, and in the committed `stacks/locks/NAME.audit.json`
so `validate` needs neither the network nor the wheels.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from stackbuild.paths import cache_dir
from stackbuild.spec.lock.elf import GpuCode, read_elf_path

AUDIT_FORMAT = 3  # 2: fatbins from large-data sections too; 3: provides

# Libraries whose SONAME major is the CUDA major (cufft/cusparse/curand/cusolver number themselves).
_CUDA_LIB_RE = re.compile(r"^lib(cudart|cublas|cublasLt|nvrtc|nvJitLink)(?:-[0-9a-f]{8})?\.so\.(\d+)")
_SO_RE = re.compile(r"\.so(\.\d+)*$")


@dataclass
class WheelAudit:
    wheel: str
    sha256: str
    shared_objects: int = 0
    cuda_links: dict[str, int] = field(default_factory=dict)  # "libcudart.so.13" -> 13
    sass: list[int] = field(default_factory=list)
    ptx: list[int] = field(default_factory=list)
    provides: list[str] = field(default_factory=list)  # CUDA libraries it ships (SONAMEs), e.g. libcudart.so.12
    format: int = AUDIT_FORMAT

    @property
    def cuda_majors(self) -> list[int]:
        return sorted(set(self.cuda_links.values()))

    @classmethod
    def from_dict(cls, d: dict[str, object]) -> WheelAudit:
        return cls(**d)  # type: ignore[arg-type]


def cuda_link(name: str) -> int | None:
    m = _CUDA_LIB_RE.match(name)
    return int(m.group(2)) if m else None


def audit_wheel(path: Path, sha256: str, name: str | None = None) -> WheelAudit:
    out = WheelAudit(name or path.name, sha256)
    gpu = GpuCode()
    with zipfile.ZipFile(path) as z, tempfile.TemporaryDirectory(prefix="stackbuild-audit-") as tmp:
        for info in z.infolist():
            if info.is_dir() or not _SO_RE.search(info.filename):
                continue
            dest = Path(tmp) / "obj.so"
            with z.open(info) as src, dest.open("wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            facts = read_elf_path(dest)
            dest.unlink()
            if facts is None:
                continue
            out.shared_objects += 1
            gpu.merge(facts.gpu)
            if facts.soname and cuda_link(facts.soname) is not None:
                out.provides.append(facts.soname)
            for lib in facts.needed:
                major = cuda_link(lib)
                if major is not None:
                    out.cuda_links[re.sub(r"-[0-9a-f]{8}", "", lib)] = major
    out.sass, out.ptx, out.provides = sorted(gpu.sass), sorted(gpu.ptx), sorted(set(out.provides))
    out.cuda_links = dict(sorted(out.cuda_links.items()))
    return out


def cache_file(sha256: str) -> Path:
    return cache_dir() / "audit" / f"{sha256}.json"


def cached_audit(sha256: str) -> WheelAudit | None:
    p = cache_file(sha256)
    try:
        d = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    return WheelAudit.from_dict(d) if d.get("format") == AUDIT_FORMAT else None


def store(a: WheelAudit) -> None:
    p = cache_file(a.sha256)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(asdict(a), sort_keys=True))
    os.replace(tmp, p)


def audit_cached(sha256: str, name: str, fetch: Callable[[], Path]) -> WheelAudit:
    """From the cache, else fetch the wheel and read it (then cache)."""
    hit = cached_audit(sha256)
    if hit is not None:
        return hit
    a = audit_wheel(fetch(), sha256, name)
    store(a)
    return a


def load_committed(path: Path) -> dict[str, WheelAudit]:
    """dist name -> audit, from a committed NAME.audit.json (empty when absent or unreadable)."""
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if d.get("format") != AUDIT_FORMAT:
        return {}
    return {n: WheelAudit.from_dict(a) for n, a in d.get("wheels", {}).items()}


def dump_committed(audits: dict[str, WheelAudit]) -> str:
    return (
        json.dumps(
            {"format": AUDIT_FORMAT, "wheels": {n: asdict(a) for n, a in sorted(audits.items())}},
            indent=1,
            sort_keys=True,
        )
        + "\n"
    )


def arch_name(n: int) -> str:
    return f"sm_{n}"


def covers(a: WheelAudit, target: int) -> bool:
    return code_covers(a.sass, a.ptx, target)


def code_covers(sass: Iterable[int], ptx: Iterable[int], target: int) -> bool:
    """SASS for the target (or an earlier minor of its major: binary compatible) or PTX at or below it."""
    sass, ptx = set(sass), set(ptx)
    if not sass and not ptx:
        return True  # no GPU code here: nothing to run
    major = target // 10
    return any(s // 10 == major and s <= target for s in sass) or any(p <= target for p in ptx)


def arch_number(arch: str) -> int | None:
    m = re.fullmatch(r"sm_(\d+)[af]?", arch)
    return int(m.group(1)) if m else None
