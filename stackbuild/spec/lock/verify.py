"""`stackbuild lock STACK --verify`: the real closure proven on this machine, without a GPU or docker.

The committed lock is installed the way the image's deps stage installs it (pip, every file
hash-checked, wheels only, no dependency resolution) into a scratch venv of the stack's Python,
from the wheel cache `lock` fills; then the image's own checks run there: `pip check`,
verify_image.py (every locked version installed, torch.version.cuda the locked CUDA), and
sglang's own argument parser on exactly the server flags the unit renders (parsed, not launched:
importing sglang's server_args imports torch, not the kernels). A flow of named steps; the
commands are small pure argv builders and the runner is effects.proc's (a FakeRun in tests).
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from packaging.utils import parse_wheel_filename

from stackbuild.effects import proc
from stackbuild.errors import GateFailed, InfraError, InputError
from stackbuild.spec.lock import wheels
from stackbuild.spec.lock.resolve import Lock
from stackbuild.spec.lock.target import Target

Run = Callable[..., proc.Completed]
Fetch = Callable[[Lock, Target], list[wheels.WheelFile]]

# sglang's own parser, built the way prepare_server_args builds it (ServerArgs.add_cli_args), but
# with prefix abbreviations off so `--tp` is refused as validate refuses it. Parsing imports
# torch, not the kernels, and starts nothing. The image's smoke test runs the same script.
PARSER_SCRIPT = (
    "import argparse, sys\n"
    "from sglang.srt.server_args import ServerArgs\n"
    "p = argparse.ArgumentParser(prog='sglang.launch_server', allow_abbrev=False)\n"
    "ServerArgs.add_cli_args(p)\n"
    "p.parse_args(sys.argv[1:])\n"
    "print('SERVER-ARGS-OK')\n"
)
# Prints the interpreter's version, and fails where `venv` is missing (Debian splits it out).
PROBE = "import sys, venv; print('%d.%d.%d' % sys.version_info[:3])"


class VerifyFailed(GateFailed):
    """The closure installed but a check said no (exit 1, like a failed gate or a stale --check)."""


@dataclass(frozen=True)
class Python:
    path: str
    version: str  # X.Y.Z


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)


# --- argv builders (pure) ---------------------------------------------------------------------------


def venv_argv(python: str, venv: Path) -> list[str]:
    return [python, "-m", "venv", "--clear", str(venv)]


def install_argv(vpy: Path, links: Path, lock_file: Path) -> list[str]:
    """The image's deps stage (`pip install --require-hashes --no-deps --only-binary=:all: -r LOCK`),
    from the local wheels only."""
    return [str(vpy), "-m", "pip", "install", "--require-hashes", "--no-deps", "--only-binary=:all:",
            "--no-index", "--find-links", str(links), "--no-cache-dir", "--disable-pip-version-check",
            "--quiet", "-r", str(lock_file)]  # fmt: skip


def check_argv(vpy: Path) -> list[str]:
    return [str(vpy), "-m", "pip", "check"]


def versions_argv(vpy: Path, script: Path, lock_file: Path, torch_cuda: str) -> list[str]:
    return [str(vpy), str(script), str(lock_file), torch_cuda]


def parser_argv(python: str | Path, server_args: list[str]) -> list[str]:
    """python -c PARSER_SCRIPT followed by exactly the server's rendered arguments."""
    return [str(python), "-c", PARSER_SCRIPT, *server_args]


# --- decisions (pure) --------------------------------------------------------------------------------


def candidates(version: str, path_env: str, home: Path, pyenv_root: str | None) -> list[str]:
    """Where a `pythonX.Y` may be, in the order tried: PATH, pyenv's versions, uv's managed ones."""
    name = f"python{version}"
    out = [str(Path(d) / name) for d in path_env.split(os.pathsep) if d]
    for root in (Path(pyenv_root) if pyenv_root else None, home / ".pyenv"):
        if root is not None:
            found = (root / "versions").glob(f"{version}.*/bin/{name}")
            out += sorted((str(p) for p in found), key=_version_key, reverse=True)
    uv_dir = Path(os.environ.get("UV_PYTHON_INSTALL_DIR", home / ".local" / "share" / "uv" / "python"))
    out += sorted((str(p) for p in uv_dir.glob(f"cpython-{version}.*/bin/{name}")), key=_version_key, reverse=True)
    return list(dict.fromkeys(out))


def _version_key(path: str) -> tuple[int, ...]:
    m = re.search(r"(\d+)\.(\d+)\.(\d+)", path)
    return tuple(int(x) for x in m.groups()) if m else ()


def needs_glibc(name: str) -> tuple[int, int] | None:
    """The oldest glibc a wheel installs on (its most lenient manylinux tag); None when it needs none."""
    best: tuple[int, int] | None = None
    for tag in parse_wheel_filename(name)[3]:
        m = re.match(r"manylinux_(\d+)_(\d+)_", tag.platform)
        legacy = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
        need = (int(m.group(1)), int(m.group(2))) if m else legacy.get(tag.platform.rsplit("_", 2)[0])
        if need is None and tag.platform == "any":
            return None
        if need is not None and (best is None or need < best):
            best = need
    return best


def too_new(files: Iterable[wheels.WheelFile], glibc: tuple[int, int]) -> list[str]:
    """Locked wheels this machine's glibc cannot install (the image's base has a newer one)."""
    return sorted(f.name for f in files if (need := needs_glibc(f.name)) is not None and need > glibc)


def rejected(stderr: str) -> tuple[str | None, str]:
    """(the flag argparse named, its reason) from a parser's error output (pure)."""
    line = next((ln for ln in reversed(stderr.splitlines()) if ": error: " in ln), None)
    if line is None:
        tail = stderr.strip().splitlines()
        return None, tail[-1] if tail else "no output"
    reason = line.split(": error: ", 1)[1]
    m = re.match(r"argument (--[\w-]+)", reason) or re.search(r"(--[\w-]+)", reason)
    return (m.group(1) if m else None), reason


# --- the steps ----------------------------------------------------------------------------------------


def find_python(version: str, explicit: str | None, *, run: Run = proc.run) -> Python:
    """The first candidate that runs, is `version` and has venv (a pyenv shim for another version fails)."""
    tried = [explicit] if explicit else candidates(
        version, os.environ.get("PATH", ""), Path.home(), os.environ.get("PYENV_ROOT")
    )
    for cand in tried:
        if not explicit and not os.access(cand, os.X_OK):
            continue
        done = run([cand, "-c", PROBE], check=False, timeout=30, what=f"probing {cand}")
        got = done.stdout.strip()
        if done.returncode == 0 and (got == version or got.startswith(version + ".")):
            return Python(cand, got)
    where = explicit or f"python{version} on PATH, under pyenv or uv"
    raise InfraError(
        f"no working python {version} with venv found ({where}); install it (`uv python install {version}`, "
        f"or your distro's python{version} and python{version}-venv) or pass --python PATH"
    )


def fetch_all(lock: Lock, t: Target) -> list[wheels.WheelFile]:
    """Every locked wheel for the target, in the cache, each checked against its sha256."""

    def one(name: str) -> wheels.WheelFile:
        w = wheels.locate(lock.entries[name], t)
        wheels.fetch(w)
        return w

    with ThreadPoolExecutor(max_workers=8) as pool:
        return list(pool.map(one, sorted(lock.entries)))


def link_dir(files: list[wheels.WheelFile], dest: Path) -> None:
    """pip finds wheels by file name: name each cached file (stored by sha256) as its wheel."""
    dest.mkdir(parents=True, exist_ok=True)
    for w in files:
        cached = wheels.cached(w.sha256)
        if cached is None:
            raise InfraError(f"{w.name} is not in the wheel cache")
        os.symlink(cached, dest / w.name)


@dataclass(frozen=True)
class Inputs:
    """What verifying a stack takes, computed from its spec and its committed files."""

    label: str
    python: str
    lock: Lock
    target: Target
    verify_script: str
    torch_cuda: str
    server_args: list[str]  # the rendered server command from --model-path on
    sglang: str | None  # the locked sglang version (None: built from source, not in the lock)


def verify(
    inp: Inputs,
    *,
    python: str | None = None,
    keep: bool = False,
    venv: Path | None = None,
    run: Run = proc.run,
    fetch: Fetch = fetch_all,
    say: Callable[[str], None] = lambda _: None,
) -> Report:
    """Install the lock into a scratch venv and run the image's checks there; raise on the first that fails.

    The venv is removed afterwards unless `keep`; `venv` names one to install into and keep, which a later
    run of the same lock reuses without installing again (its stamp file holds the lock's sha256).
    """
    report = Report()

    def step(line: str, since: float) -> None:
        report.lines.append(f"{line} ({time.monotonic() - since:.0f} s)")
        say(report.lines[-1])

    t0 = time.monotonic()
    py = find_python(inp.python, python, run=run)
    step(f"python {py.version} at {py.path}", t0)
    t0 = time.monotonic()
    files = fetch(inp.lock, inp.target)
    size = sum(p.stat().st_size for w in files if (p := wheels.cached(w.sha256)))
    step(f"fetched {len(files)} locked wheels into the cache, sha256-checked ({size / 1e9:.1f} GB)", t0)
    glibc = _machine_glibc()
    if glibc is not None and (bad := too_new(files, glibc)):
        raise InfraError(
            f"{len(bad)} locked wheel(s) need a newer glibc than this machine's {glibc[0]}.{glibc[1]} "
            f"({', '.join(bad[:3])}); verify on a machine with the base image's glibc"
        )
    work = Path(tempfile.mkdtemp(prefix=f"stackbuild-verify-{inp.label}-"))
    try:
        _install(inp, py, files, work, venv or work / "venv", run=run, step=step)
        _checks(inp, (venv or work / "venv") / "bin" / "python", work, run=run, step=step)
    finally:
        if keep or venv is not None:
            say(f"kept the venv: {venv or work / 'venv'}")
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    return report


STAMP = "stackbuild-lock.sha256"


def _install(
    inp: Inputs, py: Python, files: list[wheels.WheelFile], work: Path, venv: Path, *, run: Run,
    step: Callable[[str, float], None],
) -> None:
    """The venv, created and filled from the lock, unless it already holds this lock's install."""
    (work / "requirements.lock").write_text(inp.lock.text, encoding="utf-8")
    (work / "verify_image.py").write_text(inp.verify_script, encoding="utf-8")
    digest = hashlib.sha256(inp.lock.text.encode()).hexdigest()
    stamp = venv / STAMP
    t0 = time.monotonic()
    if stamp.is_file() and stamp.read_text().strip() == digest and (venv / "bin" / "python").exists():
        step(f"reused {venv}: it holds this lock's install", t0)
        return
    if venv.exists() and any(venv.iterdir()) and not stamp.is_file():
        raise InputError(f"--venv {venv} is not empty and not a venv `lock --verify` made; name a new directory")
    link_dir(files, work / "wheels")
    run(venv_argv(py.path, venv), timeout=300, what=f"creating a python {py.version} venv")
    done = run(install_argv(venv / "bin" / "python", work / "wheels", work / "requirements.lock"), check=False,
               timeout=3600, what="pip install")
    if done.returncode != 0:
        raise VerifyFailed(f"installing the lock failed: {_tail(done.stderr or done.stdout)}")
    venv.mkdir(parents=True, exist_ok=True)
    stamp.write_text(digest + "\n")
    step(f"installed {len(files)} distributions: hash-checked, wheels only, no dependency resolution", t0)


def _checks(inp: Inputs, vpy: Path, work: Path, *, run: Run, step: Callable[[str, float], None]) -> None:
    """The image's own checks, in the venv: pip check, verify_image.py, sglang's parser on the rendered flags."""
    lock_file, script = work / "requirements.lock", work / "verify_image.py"
    t0 = time.monotonic()
    done = run(check_argv(vpy), check=False, timeout=600, what="pip check")
    if done.returncode != 0:
        raise VerifyFailed(f"pip check: {_tail(done.stdout + done.stderr, 5)}")
    step("pip check: no broken requirements", t0)
    t0 = time.monotonic()
    done = run(versions_argv(vpy, script, lock_file, inp.torch_cuda), check=False, timeout=600, what="versions")
    bad = [ln.removeprefix("MISMATCH ") for ln in done.stdout.splitlines() if ln.startswith("MISMATCH ")]
    if done.returncode != 0 or bad:
        raise VerifyFailed("versions: " + ("; ".join(bad) or _tail(done.stdout + done.stderr)))
    said = [ln for ln in done.stdout.splitlines() if ln.startswith(("VERIFIED ", "torch.version.cuda "))]
    step("versions: " + "; ".join(said), t0)
    if inp.sglang is None:
        step("sglang's parser: not checked (sglang is built from source, not in the lock)", time.monotonic())
        return
    t0 = time.monotonic()
    done = run(parser_argv(vpy, inp.server_args), check=False, timeout=600, what="sglang's parser")
    if done.returncode != 0 or "SERVER-ARGS-OK" not in done.stdout:
        flag, reason = rejected(done.stderr)
        head = f"sglang {inp.sglang}'s parser rejects {flag}" if flag else f"sglang {inp.sglang}'s parser failed"
        raise VerifyFailed(f"{head}: {reason}")
    n = sum(1 for a in inp.server_args if a.startswith("--"))
    step(f"sglang {inp.sglang}'s own parser accepts the {n} rendered server flags", t0)


def _machine_glibc() -> tuple[int, int] | None:
    lib, ver = platform.libc_ver()
    m = re.match(r"(\d+)\.(\d+)", ver)
    return (int(m.group(1)), int(m.group(2))) if lib == "glibc" and m else None


def _tail(text: str, n: int = 3) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-n:]) or "no output"
