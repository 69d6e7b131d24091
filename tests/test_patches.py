"""Patches are checked against the real sglang 0.5.23 source from its wheel."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers_spec import BASE, project, run_cli, write_empty_lock

from stackbuild.paths import shipped_dir

SHIPPED = shipped_dir("stacks") / "patches" / "sglang-0.5.23-sm120-trtllm-allreduce.patch"
WITH_FUSION = BASE.replace("    --tp-size: 8\n", "    --tp-size: 8\n    --flashinfer-allreduce-fusion-backend: auto\n")


def _project_with_patch(tmp_path: Path, patch_text: str) -> Path:
    root = project(tmp_path, {"s.yaml": WITH_FUSION + "patches: [patches/p.patch]\n"})
    (root / "stacks" / "patches").mkdir()
    (root / "stacks" / "patches" / "p.patch").write_text(patch_text)
    write_empty_lock(root, "s")
    return root


def test_shipped_patch_applies_and_satisfies_fusion_rule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _project_with_patch(tmp_path, SHIPPED.read_text())
    rc, err, out = run_cli(capsys, "--root", str(root), "validate", "s")
    # It applies; what it does is said: it enables the plain trtllm allreduce, which the PCIe-IPC env loses to.
    assert (rc, err) == (
        0,
        [
            "stacks/s.yaml:19:11: warning: this patch lets FlashInfer's trtllm allreduce run on sm_120, and "
            "all_reduce() tries it before pcie_ipc: it displaces the PCIe-IPC allreduce "
            "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE asks for; fused allreduce+RMSNorm stays off (add_norm.py "
            "flashinfer_ar_fusion_applies: SM90/SM100 only) [patch-trtllm-displaces-ipc]"
        ],
    )
    assert out.strip() == "ok: 1 stack(s) valid, 1 warning(s)"


def test_hunk_that_does_not_apply_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = SHIPPED.read_text().replace(
        '-            "FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs."',
        '-            "FlashInfer allreduce fusion requires SM90 NVIDIA GPUs."',
    )
    root = _project_with_patch(tmp_path, broken)
    rc, err, _ = run_cli(capsys, "--root", str(root), "validate", "s")
    assert rc == 2
    assert next(e for e in err if ": error: " in e) == (
        "stacks/s.yaml:19:11: error: patches: p.patch:12: hunk #2 of "
        "sglang/srt/layers/flashinfer_comm_fusion.py does not apply to sglang 0.5.23 (expected near "
        "line 47); rebase the patch on 0.5.23 [patch]"
    )


def test_patch_already_applied_upstream_warns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A patch whose "after" side is what 0.5.23 already ships: reversing it applies.
    lines = SHIPPED.read_text().splitlines(keepends=True)
    swapped = []
    for ln in lines:
        if ln.startswith("--- ") or ln.startswith("+++ "):
            swapped.append(ln)
        elif ln.startswith("-"):
            swapped.append("+" + ln[1:])
        elif ln.startswith("+"):
            swapped.append("-" + ln[1:])
        elif ln.startswith("@@"):
            import re

            m = re.match(r"@@ -(\d+),(\d+) \+(\d+),(\d+) @@", ln)
            assert m
            a, b, c, d = m.groups()
            swapped.append(f"@@ -{c},{d} +{a},{b} @@\n")
        else:
            swapped.append(ln)
    root = project(tmp_path, {"s.yaml": BASE + "patches: [patches/p.patch]\n"})
    (root / "stacks" / "patches").mkdir()
    (root / "stacks" / "patches" / "p.patch").write_text("".join(swapped))
    write_empty_lock(root, "s")
    rc, err, _ = run_cli(capsys, "--root", str(root), "validate", "s")
    assert rc == 0
    assert err == [
        "stacks/s.yaml:18:11: warning: patches: p.patch:1: already applied upstream in sglang 0.5.23; "
        "drop this patch [patch-applied]"
    ]


def test_patch_for_a_file_sglang_does_not_ship(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = "--- a/sglang/srt/nope.py\n+++ b/sglang/srt/nope.py\n@@ -1,1 +1,1 @@\n-a\n+b\n"
    root = project(tmp_path, {"s.yaml": BASE + "patches: [patches/p.patch]\n"})
    (root / "stacks" / "patches").mkdir()
    (root / "stacks" / "patches" / "p.patch").write_text(text)
    write_empty_lock(root, "s")
    rc, err, _ = run_cli(capsys, "--root", str(root), "validate", "s")
    assert rc == 2
    assert err[0] == (
        "stacks/s.yaml:18:11: error: patches: p.patch:2: patches sglang/srt/nope.py, which sglang "
        "0.5.23 does not ship; paths must be relative to site-packages (a/sglang/...) [patch]"
    )
