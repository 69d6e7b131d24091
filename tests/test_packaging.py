"""The wheel carries the templates and shipped stacks: it works outside the checkout."""

from __future__ import annotations

import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.integration
def test_installed_wheel_lists_validates_and_renders(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(ROOT)], check=True, timeout=300
    )
    (wheel,) = dist.glob("stackbuild-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "stackbuild/_shipped/templates/Dockerfile.sglang.j2" in names
    assert "stackbuild/_shipped/stacks/cuda13.yaml" in names
    assert "stackbuild/_shipped/stacks/patches/sglang-0.5.23-sm120-trtllm-allreduce.patch" in names

    env_dir = tmp_path / "venv"
    venv.create(env_dir, system_site_packages=True, with_pip=True)
    py = env_dir / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True, timeout=300)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    exe = str(env_dir / "bin" / "stackbuild")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([exe, *args], cwd=elsewhere, capture_output=True, text=True, timeout=120)

    listed = run("list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert "cuda13" in listed.stdout and "sim" in listed.stdout
    assert run("validate").returncode == 0
    out = tmp_path / "out"
    rendered = run("render", "cuda13", "--out", str(out))
    assert rendered.returncode == 0, rendered.stderr
    assert (out / "Dockerfile").read_text() == (ROOT / "Dockerfile.cuda13").read_text()
