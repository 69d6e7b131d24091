"""`stackbuild lock` end to end with the index and the resolver replaced by fakes of our own interfaces."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers_spec import BASE, project, run_cli

from stackbuild.spec import sglang
from stackbuild.spec.lock import audit, resolve, wheels
from stackbuild.spec.lock.target import Target

H_TORCH, H_RT, H_SGL = "d" * 64, "a" * 64, "c" * 64


def body(runtime: str) -> str:
    return (
        "--index-url https://pypi.org/simple\n\n"
        f"{runtime} \\\n    --hash=sha256:{H_RT}\n    # via torch\n    # from https://pypi.org/simple\n"
        f"sglang==0.5.23 \\\n    --hash=sha256:{H_SGL}\n    # via -r requirements.in\n"
        "    # from https://pypi.org/simple\n"
        f"torch==2.14.1 \\\n    --hash=sha256:{H_TORCH}\n    # via\n    #   -r requirements.in\n    #   sglang\n"
        "    # from https://pypi.org/simple\n"
    )


@pytest.fixture
def fake_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """uv answers with `state['body']`; torch is the only native wheel, its audit already cached."""
    monkeypatch.setenv("STACKBUILD_CACHE_DIR", str(tmp_path / "cache"))
    state = {"body": body("nvidia-cuda-runtime==13.0.96")}
    monkeypatch.setattr(resolve, "resolve", lambda t, offline=False: state["body"])

    def locate(e: resolve.Entry, t: Target) -> wheels.WheelFile:
        tag = "cp312-cp312-manylinux_2_28_x86_64" if e.name == "torch" else "py3-none-any"
        dist = e.name.replace("-", "_")
        return wheels.WheelFile(f"{dist}-{e.version}-{tag}.whl", "https://example.invalid/x", e.hashes[0])

    monkeypatch.setattr(wheels, "locate", locate)
    # the release's flag table as the wheel would give it: the committed one
    monkeypatch.setattr(sglang, "table_of_wheel", lambda v: sglang.committed_table(v))
    audit.store(audit.WheelAudit("torch-2.14.1.whl", H_TORCH, 14, {"libcudart.so.13": 13}, [100, 120], [], []))
    return state


def test_lock_writes_lock_and_audit_and_prints_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fake_index: dict[str, str]
) -> None:
    root = project(tmp_path / "p", {"s.yaml": BASE}, lock=False)
    rc, err, out = run_cli(capsys, "--root", str(root), "lock", "s")
    assert rc == 0, err
    assert out.splitlines() == [
        "s: 3 locked, 1 native wheel(s) audited, 1 carry GPU code",
        "  CUDA majors linked: 13 (1 wheels)",
        "  sm_120: SASS in 1, PTX only in 0, neither in 0",
        f"    {'torch':<32} links {'libcudart.so.13':<40} sass {'100,120':<28} ptx -",
        f"wrote {root}/stacks/locks/s.txt, {root}/stacks/locks/s.audit.json, "
        f"{root}/stacks/locks/sglang-0.5.23.flags.json",
    ]
    # the table beside the lock is the release's own, for `validate --offline` in a fresh clone
    assert sglang.committed_table("0.5.23", root) == sglang.committed_table("0.5.23")
    text = (root / "stacks" / "locks" / "s.txt").read_text()
    assert text.splitlines()[5] == "# native: torch"
    assert text.splitlines()[2] == f"# content-sha256: {resolve.content_hash(text)}"
    assert text.endswith(fake_index["body"])
    assert run_cli(capsys, "--root", str(root), "validate", "s")[:2] == (0, [])
    # offline: natives from the committed lock, audits from the committed file
    rc, err, _ = run_cli(capsys, "--root", str(root), "lock", "s", "--offline")
    assert (rc, err[-2:]) == (0, ["resolving torch==2.14.1 sglang-kernel==0.4.10 flashinfer-python==0.7.2 "
                                  "sglang==0.5.23 for python 3.12 on x86_64-manylinux_2_39",
                                  "base image nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04 is pinned by the spec "
                                  f"(sha256:{'5e' * 32})"])  # fmt: skip


def test_a_closure_of_the_wrong_cuda_major_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fake_index: dict[str, str]
) -> None:
    root = project(tmp_path / "p", {"s.yaml": BASE.replace("13.0.1", "12.8.1").replace("cu130", "cu126")}, lock=False)
    rc, err, _ = run_cli(capsys, "--root", str(root), "lock", "s")
    assert rc == 2
    assert [e for e in err if ": error: " in e] == [
        "stacks/s.yaml:5:3: error: nvidia-cuda-runtime==13.0.96 (pulled in by torch) is a CUDA 13 package, which "
        "needs driver >= 580; this stack is CUDA 12.8.1 (driver >= 570) [lock-cuda-major]",
        "stacks/s.yaml:5:3: error: torch-2.14.1.whl (pulled in by torch) links libcudart.so.13: CUDA 13, driver >= "
        "580; this stack is CUDA 12.8.1 (driver >= 570) [audit-cuda-major]",
    ]
    assert err[-1] == "stackbuild: 2 error(s) in the resolved closure of s; nothing was written"
    assert not (root / "stacks" / "locks").exists()
