"""The build context (rendered files, patches, wheelhouse), its content hash, and build parallelism.

The hash covers everything that changes the image: every file in the context
and the base image's id. The project wheel is hashed by the sources it is built
from, not its bytes, so two machines with the same checkout agree on the tag.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import tempfile
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from builder import proc
from builder.errors import InputError

HASH_LEN = 12
WHEELHOUSE = "wheelhouse"
# What the project wheel is built from; anything else in the checkout does not reach the image.
PROJECT_INPUTS = ("pyproject.toml", "README.md", "builder", "stacks", "templates")


def cache_dir() -> Path:
    return Path(os.environ.get("STACKBUILD_CACHE_DIR") or Path.home() / ".cache" / "stackbuild")


def content_hash(file_digests: Mapping[str, str], base_id: str | None) -> str:
    """sha256 over (path, digest) pairs in path order plus the base image id (pure)."""
    h = hashlib.sha256()
    h.update(f"base {base_id or '-'}\n".encode())
    for path in sorted(file_digests):
        h.update(f"{path} {file_digests[path]}\n".encode())
    return h.hexdigest()


def image_tag(repo: str, label: str, digest: str) -> str:
    """REPO:STACK[-VARIANT]-HASH12."""
    return f"{repo}:{label}-{digest[:HASH_LEN]}"


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class Parallelism:
    max_jobs: int
    nvcc_threads: int


def parallelism(cpus: int, mem_bytes: int, *, max_jobs: int | None, nvcc_threads: int | None) -> Parallelism:
    """Compile parallelism from the machine unless the spec pins it (pure).

    A CUDA translation unit can take ~4 GiB per nvcc thread; jobs x threads stays
    within the cores and within memory / 4 GiB, so a big build does not OOM. A
    second nvcc thread per job only where memory is not the limit.
    """
    mem_slots = max(1, mem_bytes // (4 << 30))
    threads = nvcc_threads or (2 if cpus >= 16 and mem_slots >= cpus else 1)
    jobs = max_jobs or max(1, min(cpus // threads, mem_slots // threads))
    return Parallelism(jobs, threads)


def machine_parallelism(max_jobs: int | None, nvcc_threads: int | None) -> Parallelism:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return parallelism(cpus, mem, max_jobs=max_jobs, nvcc_threads=nvcc_threads)


# --- wheelhouse ---------------------------------------------------------------------------


def project_root() -> Path:
    root = Path(__file__).resolve().parents[2]
    if not (root / "pyproject.toml").is_file():
        raise InputError(
            f"{root}: the sim image needs the stackbuild source tree to build its wheel; "
            "run stackbuild from a checkout (pip install -e .)"
        )
    return root


def _walk(root: Path, names: Iterable[str]) -> list[Path]:
    out: list[Path] = []
    for n in names:
        p = root / n
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            out += [f for f in p.rglob("*") if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc"]
    return sorted(out)


def project_source_hash(root: Path) -> str:
    h = hashlib.sha256()
    for f in _walk(root, PROJECT_INPUTS):
        h.update(f"{f.relative_to(root)} {sha256_file(f)}\n".encode())
    return h.hexdigest()


def runtime_requirements(root: Path) -> list[str]:
    data = tomllib.loads((root / "pyproject.toml").read_text())
    return list(data["project"]["dependencies"])


def _target_platforms() -> list[str]:
    arch = platform.machine() or "x86_64"
    # bookworm has glibc 2.36: any manylinux wheel up to 2_36 runs there.
    return [f"manylinux_2_{minor}_{arch}" for minor in range(36, 16, -1)] + [f"manylinux2014_{arch}", "any"]


def download_deps_argv(python: str, requirements: Path, dest: Path) -> list[str]:
    """pip download of binary wheels for the image's interpreter, not the host's (pure)."""
    plat: list[str] = []
    for p in _target_platforms():
        plat += ["--platform", p]
    abi = "cp" + python.replace(".", "")
    return [
        "python3",
        "-m",
        "pip",
        "download",
        "--quiet",
        "--only-binary=:all:",
        "--implementation",
        "cp",
        "--python-version",
        python,
        "--abi",
        abi,
        "--abi",
        "abi3",
        "--abi",
        "none",
        *plat,
        "--dest",
        str(dest),
        "-r",
        str(requirements),
    ]


def _atomic_dir(final: Path, fill: Callable[[Path], None]) -> Path:
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=final.name + ".", dir=final.parent))
    try:
        fill(tmp)
        try:
            tmp.rename(final)
        except OSError:  # another build made it meanwhile
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def deps_wheels(python: str, root: Path) -> Path:
    """Cached dir of the runtime dependencies' wheels + a pinned requirements.txt."""
    reqs = runtime_requirements(root)
    key = hashlib.sha256(json.dumps([python, platform.machine(), reqs]).encode()).hexdigest()[:16]

    def fill(tmp: Path) -> None:
        (tmp / "top.txt").write_text("\n".join(reqs) + "\n")
        proc.run(download_deps_argv(python, tmp / "top.txt", tmp), timeout=900, what="pip download (wheelhouse)")
        (tmp / "top.txt").unlink()
        pins = sorted("{}=={}".format(*w.name.split("-")[:2]) for w in tmp.glob("*.whl"))
        (tmp / "requirements.txt").write_text("\n".join(pins) + "\n")

    return _atomic_dir(cache_dir() / "wheelhouse" / f"deps-py{python}-{key}", fill)


def app_wheel(root: Path) -> tuple[Path, str]:
    """Cached dir holding the project wheel, keyed by the project's sources."""
    src = project_source_hash(root)

    def fill(tmp: Path) -> None:
        proc.run(
            ["python3", "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(tmp), str(root)],
            timeout=600,
            what="pip wheel (project)",
        )

    return _atomic_dir(cache_dir() / "wheelhouse" / f"app-{src[:16]}", fill), src


def needs_wheelhouse(dockerfile: str) -> bool:
    return f"{WHEELHOUSE}/" in dockerfile


@dataclass(frozen=True)
class Context:
    dir: Path
    digests: dict[str, str]  # relpath -> sha256 (the project wheel: its source hash)


def assemble(files: Mapping[str, str], dest: Path, *, python: str) -> Context:
    """Write the rendered files and, when the Dockerfile asks for it, the wheelhouse."""
    digests: dict[str, str] = {}
    for rel, text in files.items():
        p = dest / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        digests[rel] = hashlib.sha256(text.encode()).hexdigest()
    if needs_wheelhouse(files.get("Dockerfile", "")):
        root = project_root()
        deps = deps_wheels(python, root)
        app, src = app_wheel(root)
        for sub, srcdir in (("deps", deps), ("app", app)):
            out = dest / WHEELHOUSE / sub
            out.mkdir(parents=True, exist_ok=True)
            for f in srcdir.iterdir():
                _link(f, out / f.name)
                rel = f"{WHEELHOUSE}/{sub}/{f.name}"
                digests[rel] = src if sub == "app" else sha256_file(f)
    return Context(dest, digests)


def _link(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
