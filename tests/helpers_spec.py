"""Shared bits for spec tests: a project root in tmp_path and a CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stackbuild.cli.main import main

BASE = """\
base_image: nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04@sha256:""" + "5e" * 32 + """
cuda: "13.0.1"
arches: [sm_120]
components:
  torch: {version: 2.14.1, index: "https://download.pytorch.org/whl/cu130"}
  sgl_kernel: {version: 0.4.10}
  flashinfer: {version: 0.7.2}
  sglang: {version: 0.5.23}
server:
  model_path: /models/m
  flags:
    --tp-size: 8
  env:
    SGLANG_ENABLE_PCIE_IPC_ALLREDUCE: "1"
runtime:
  gpus: 8
  tp: 8
"""


def project(tmp_path: Path, files: dict[str, str], *, lock: bool = True) -> Path:
    """stacks/ under tmp_path; with `lock`, each loadable sglang stack gets an empty, fresh lock
    (so tests about other checks are not about the lock)."""
    for rel, text in files.items():
        p = tmp_path / "stacks" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    if lock:
        for rel in files:
            if rel.endswith(".yaml") and "/" not in rel and not rel.startswith("_"):
                write_empty_lock(tmp_path, rel.removesuffix(".yaml"))
    return tmp_path


def write_empty_lock(root: Path, name: str, body: str = "") -> None:
    """A lock whose inputs match the stack, with `body` as its resolved part."""
    from stackbuild.errors import SpecError
    from stackbuild.spec.load import load_stack
    from stackbuild.spec.lock.resolve import header, seal
    from stackbuild.spec.lock.target import build_lock_path, lock_path, target_of

    try:
        stack = load_stack(name, root=root)
    except SpecError:
        return
    t = target_of(stack)
    if t is not None:
        lock_path(stack).parent.mkdir(parents=True, exist_ok=True)
        lock_path(stack).write_text(seal(header(t, name, []) + body))
        if t.build_tools:  # the source stages' build tools, resolved for the same inputs
            build_lock_path(stack).write_text(seal(header(t, name, [])))


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str, cwd: Path | None = None) -> tuple[int, list[str], str]:
    """Run the CLI in-process; with `--root R` it runs from R, as a user would."""
    if cwd is None and "--root" in argv:
        cwd = Path(argv[argv.index("--root") + 1])
    old = Path.cwd()
    if cwd is not None:
        os.chdir(cwd)
    try:
        rc = main(list(argv))
    finally:
        os.chdir(old)
    out, err = capsys.readouterr()
    return rc, [ln for ln in err.splitlines() if ln.strip()], out


def source_component(comp: str, version: str, repo: str, ref: str, last: str) -> str:
    """A components entry built from source, as YAML lines under `components:`; `last` is its final key."""
    return f"  {comp}:\n    version: {version}\n    source:\n      repo: {repo}\n      ref: {ref}\n      {last}\n"


def parse_with_stand_in(tmp_path: Path, add_cli_args: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The parser script (stackbuild.spec.lock.verify.PARSER_SCRIPT) under real argparse, with a stand-in for
    sglang's ServerArgs.add_cli_args (the real one imports torch); `add_cli_args` is its body, on `p`."""
    from stackbuild.spec.lock.verify import PARSER_SCRIPT

    pkg = tmp_path / "sglang" / "srt"
    pkg.mkdir(parents=True, exist_ok=True)
    (tmp_path / "sglang" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    body = "".join(f"        {ln}\n" for ln in add_cli_args.splitlines())
    (pkg / "server_args.py").write_text(
        f"class ServerArgs:\n    @staticmethod\n    def add_cli_args(p):\n{body}"
    )
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    argv = [sys.executable, "-c", PARSER_SCRIPT, *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
