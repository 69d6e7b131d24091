"""Patches are checked against the release's own source from its wheel: the dry run on a wheel made here
(unit), the shipped patch against the real sglang 0.5.23 wheel (network, fetched into the session cache),
and what `validate --offline` says when the wheel is not at hand."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from helpers_spec import BASE, project, run_cli, write_empty_lock

from stackbuild.paths import shipped_dir
from stackbuild.spec.patches import check_patch

SHIPPED = shipped_dir("stacks") / "patches" / "sglang-0.5.23-sm120-trtllm-allreduce.patch"
WITH_FUSION = BASE.replace("    --tp-size: 8\n", "    --tp-size: 8\n    --flashinfer-allreduce-fusion-backend: auto\n")


def _project_with_patch(tmp_path: Path, patch_text: str) -> Path:
    root = project(tmp_path, {"s.yaml": WITH_FUSION + "patches: [patches/p.patch]\n"})
    (root / "stacks" / "patches").mkdir()
    (root / "stacks" / "patches" / "p.patch").write_text(patch_text)
    write_empty_lock(root, "s")
    return root


@pytest.mark.network
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


@pytest.mark.network
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


@pytest.mark.network
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


@pytest.mark.network
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


SOURCE = "".join(f"line {i}\n" for i in range(1, 21))
EDIT = "--- a/sglang/srt/m.py\n+++ b/sglang/srt/m.py\n@@ -9,3 +9,3 @@\n line 9\n-line 10\n+line ten\n line 11\n"


def _wheel(tmp_path: Path, text: str = SOURCE) -> Path:
    """A wheel of our own making with one source file: what check_patch reads from a release's wheel."""
    wheel = tmp_path / "sglang-9.9-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("sglang/srt/m.py", text)
    return wheel


def _check(tmp_path: Path, patch: str, wheel: Path) -> list[tuple[str, int, str]]:
    path = tmp_path / "p.patch"
    path.write_text(patch)
    return [(i.severity, i.line, i.message) for i in check_patch(path, patch, wheel, "9.9")]


def test_a_patch_that_applies_is_silent_and_one_already_applied_warns(tmp_path: Path) -> None:
    assert _check(tmp_path, EDIT, _wheel(tmp_path)) == []
    applied = _wheel(tmp_path, SOURCE.replace("line 10\n", "line ten\n"))
    assert _check(tmp_path, EDIT, applied) == [
        ("warning", 1, "already applied upstream in sglang 9.9; drop this patch")
    ]


def test_the_hunk_that_fails_is_named_at_its_line_in_the_patch(tmp_path: Path) -> None:
    moved = EDIT + "@@ -15,3 +15,3 @@\n line 15\n-line sixteen\n+line 16b\n line 17\n"
    assert _check(tmp_path, moved, _wheel(tmp_path)) == [
        ("error", 8, "hunk #2 of sglang/srt/m.py does not apply to sglang 9.9 (expected near line 15); "
                     "rebase the patch on 9.9")
    ]
    elsewhere = EDIT.replace("m.py", "gone.py")
    assert _check(tmp_path, elsewhere, _wheel(tmp_path)) == [
        ("error", 2, "patches sglang/srt/gone.py, which sglang 9.9 does not ship; paths must be relative to "
                     "site-packages (a/sglang/...)")
    ]


def test_offline_without_the_source_says_what_is_not_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty cache holds no sglang wheel: the patches are not checked, and that is said (exit 0)."""
    monkeypatch.setenv("STACKBUILD_CACHE_DIR", str(tmp_path / "empty-cache"))
    root = _project_with_patch(tmp_path, SHIPPED.read_text())
    rc, err, out = run_cli(capsys, "--root", str(root), "validate", "--offline", "s")
    assert (rc, out.strip()) == (0, "ok: 1 stack(s) valid, 2 warning(s)")
    assert err[0] == (
        "stacks/s.yaml:19:1: warning: patches: not checked offline: sglang 0.5.23's source is not in the cache "
        f"({tmp_path / 'empty-cache' / 'sglang'}); run `stackbuild validate s` once online to fetch it "
        "[patch-unchecked]"
    )
