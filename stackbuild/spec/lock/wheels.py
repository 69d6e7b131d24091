"""Find and fetch the exact wheel a lock entry pins, cached by its sha256.

The file is chosen from the index's JSON simple API (PEP 691): among the files
whose sha256 the lock lists, the one whose tags the target accepts. A download
is checked against that sha256 before it lands under its final name.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from packaging.tags import Tag
from packaging.utils import parse_wheel_filename

from stackbuild.effects import http
from stackbuild.errors import InfraError
from stackbuild.paths import cache_dir
from stackbuild.spec.lock.resolve import Entry
from stackbuild.spec.lock.target import Target

ACCEPT = "application/vnd.pypi.simple.v1+json"


@dataclass(frozen=True)
class WheelFile:
    name: str  # the file name
    url: str
    sha256: str

    @property
    def native(self) -> bool:
        return any(t.platform != "any" for t in parse_wheel_filename(self.name)[3])


def cache_root() -> Path:
    return cache_dir() / "wheels"


def accepted_tags(t: Target) -> list[Tag]:
    """Tags a cpython `t.python` on `t.platform` (x86_64-manylinux_X_Y) installs, best first (pure)."""
    arch, _, rest = t.platform.partition("-")
    major, minor = (int(x) for x in rest.removeprefix("manylinux_").split("_")[:2])
    plats = [f"manylinux_{major}_{m}_{arch}" for m in range(minor, 16, -1)]
    plats += [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}", f"linux_{arch}"]
    cp = "cp" + t.python.replace(".", "")
    out = [Tag(cp, abi, p) for abi in (cp, "abi3", "none") for p in plats]
    lo = int(t.python.split(".")[1])
    out += [Tag(f"cp3{m}", "abi3", p) for m in range(lo - 1, 1, -1) for p in plats]
    pys = ["py3", *(f"py3{m}" for m in range(lo, -1, -1))]
    out += [Tag(i, "none", p) for i in pys for p in plats]
    return out + [Tag(cp, "none", "any")] + [Tag(i, "none", "any") for i in pys]


def choose(files: list[WheelFile], t: Target) -> WheelFile | None:
    """The best-ranked wheel for the target (pure)."""
    rank = {tag: i for i, tag in enumerate(accepted_tags(t))}
    best: tuple[int, WheelFile] | None = None
    for f in files:
        if not f.name.endswith(".whl"):
            continue
        scores = [rank[tag] for tag in parse_wheel_filename(f.name)[3] if tag in rank]
        if scores and (best is None or min(scores) < best[0]):
            best = (min(scores), f)
    return best[1] if best else None


def index_files(index: str, name: str) -> list[WheelFile]:
    url = f"{index.rstrip('/')}/{name}/"
    try:
        reply = http.get(url, headers={"Accept": ACCEPT}, timeout=60)
        if reply.status != 200:
            raise http.BadAnswer(f"GET {url}: HTTP {reply.status}")
        data = reply.json()
    except (http.HttpFailure, ValueError) as err:
        raise InfraError(f"cannot list {name} on {index}: {err}") from err
    return [
        WheelFile(f["filename"], urllib.parse.urljoin(url, f["url"]), f["hashes"]["sha256"])
        for f in data.get("files", [])
        if "sha256" in f.get("hashes", {})
    ]


def locate(e: Entry, t: Target) -> WheelFile:
    files = [f for f in index_files(e.index or t.index_url, e.name) if f.sha256 in e.hashes]
    got = choose(files, t)
    if got is None:
        raise InfraError(f"{e.name}=={e.version}: none of the locked files is a wheel for {t.platform}")
    return got


def cached(sha256: str) -> Path | None:
    p = cache_root() / f"{sha256}.whl"
    return p if p.is_file() else None


def fetch(w: WheelFile) -> Path:
    """The wheel's bytes in the cache, verified against its sha256 (downloaded once)."""
    hit = cached(w.sha256)
    if hit:
        return hit
    dest = cache_root() / f"{w.sha256}.whl"
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, suffix=".part")
    h = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out:
            def write(chunk: bytes) -> None:
                h.update(chunk)
                out.write(chunk)

            http.download(w.url, write, timeout=120)
        if h.hexdigest() != w.sha256:
            raise InfraError(f"{w.name}: downloaded sha256 {h.hexdigest()} is not the locked {w.sha256}")
        os.replace(tmp, dest)
    except (OSError, http.HttpFailure) as err:
        raise InfraError(f"downloading {w.name}: {err}") from err
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest
