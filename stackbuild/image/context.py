"""The build context (rendered files, patches, wheelhouse), what of it the content hash covers, and build parallelism.

There is one content hash, `render_stack`'s: the Dockerfile body, the patches,
the lock, plus the digests of context files rendering does not write (the
wheelhouse). `rendered_for_image` is the one place both `render` and `build`
get it from, so the tag a unit names is the tag a build makes. The project wheel
is hashed by the sources it is built from, not its bytes, so two machines with
the same checkout agree on the tag; its dependencies by the requirements they
are downloaded for.
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

from stackbuild.effects import proc
from stackbuild.errors import InputError
from stackbuild.paths import cache_dir
from stackbuild.render.stack import Rendered, render_stack
from stackbuild.spec.stack import Stack

WHEELHOUSE = "wheelhouse"
# What the project wheel is built from; anything else in the checkout does not reach the image.
PROJECT_INPUTS = ("pyproject.toml", "README.md", "stackbuild", "stacks", "templates")


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


def aot_jobs(cpus: int, mem_bytes: int, *, nvcc_threads: int, max_jobs: int | None) -> int:
    """Jobs for FlashInfer's AOT build by FlashInfer's own budget (pure), unless the spec pins MAX_JOBS.

    Its jit-cache build gives each job max(8, 2 x nvcc threads) GB and keeps jobs x threads within
    the cores (scripts/jit_cache_build_common.sh, compute_jit_cache_parallelism): its CUTLASS GEMM
    and MoE modules need about twice what `parallelism` budgets per translation unit.
    """
    if max_jobs:
        return max_jobs
    per_job = max(8, 2 * nvcc_threads) << 30
    jobs = max(1, min(cpus, mem_bytes // per_job))
    return jobs if jobs * nvcc_threads <= cpus else max(1, cpus // nvcc_threads)


def build_args(dockerfile: str, stack: Stack, cpus: int, mem_bytes: int) -> dict[str, str]:
    """The parallelism build args the Dockerfile declares, from the machine unless the spec pins them (pure)."""
    if "ARG MAX_JOBS" not in dockerfile:
        return {}
    b = stack.build
    par = parallelism(cpus, mem_bytes, max_jobs=b.max_jobs, nvcc_threads=b.nvcc_threads)
    out = {"MAX_JOBS": str(par.max_jobs), "NVCC_THREADS": str(par.nvcc_threads)}
    if "ARG AOT_MAX_JOBS" in dockerfile:
        out["AOT_MAX_JOBS"] = str(aot_jobs(cpus, mem_bytes, nvcc_threads=par.nvcc_threads, max_jobs=b.max_jobs))
    return out


def machine() -> tuple[int, int]:
    """(usable cores, physical memory in bytes) of the build machine."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cpus, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


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


def deps_key(python: str, root: Path) -> str:
    """What the dependency wheelhouse is downloaded for: interpreter, machine, requirements."""
    return hashlib.sha256(json.dumps([python, platform.machine(), runtime_requirements(root)]).encode()).hexdigest()


def deps_wheels(python: str, root: Path) -> Path:
    """Cached dir of the runtime dependencies' wheels + a pinned requirements.txt."""
    key = deps_key(python, root)[:16]
    reqs = runtime_requirements(root)

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


def context_inputs(dockerfile: str, python: str) -> dict[str, str]:
    """Digests of the context files rendering does not write, keyed like the context's paths."""
    if not needs_wheelhouse(dockerfile):
        return {}
    root = project_root()
    return {f"{WHEELHOUSE}/app": project_source_hash(root), f"{WHEELHOUSE}/deps": deps_key(python, root)}


def rendered_for_image(stack: Stack) -> Rendered:
    """The stack rendered with its context inputs: the files, the hash and the tag a build uses."""
    rendered = render_stack(stack)
    inputs = context_inputs(rendered.files["Dockerfile"], stack.python)
    return render_stack(stack, inputs) if inputs else rendered


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
