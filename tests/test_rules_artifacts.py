"""Rules grounded in what the real artifacts say: each case gives the exact located line and rule id."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers_spec import BASE, project, run_cli, source_component

from stackbuild.paths import shipped_dir
from stackbuild.spec.conditions import lifted_gates
from stackbuild.spec.load import load_stack
from stackbuild.spec.rules import check_rules
from stackbuild.spec.sglang import env_bool

FI_REPO = "https://github.com/flashinfer-ai/flashinfer.git"
FI_SOURCE = source_component("flashinfer", "0.7.2", FI_REPO, "v0.7.2", 'env: {FLASHINFER_DISABLE_JIT: "0"}')
SGL_REPO = "https://github.com/sgl-project/sglang.git"
SGL_SOURCE = source_component("sgl_kernel", "0.4.10", SGL_REPO, "v0.5.23", 'env: {SGL_KERNEL_ENABLE_FP4: "1"}')


def findings(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> tuple[int, list[str]]:
    root = project(tmp_path, {"s.yaml": text})
    rc, err, _ = run_cli(capsys, "--root", str(root), "validate", "s")
    return rc, [e for e in err if not e.startswith("stackbuild:")]


def test_python_the_release_and_the_distro_do_not_offer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = findings(tmp_path, capsys, BASE + 'python: "3.10"\n')
    assert rc == 2
    assert err == [
        "stacks/s.yaml:18:1: error: python 3.10 is not what ubuntu24.04 installs (it has python3.12); "
        'set python: "3.12" [python-distro]',
        "stacks/s.yaml:18:1: error: sglang 0.5.23 ships wheels for python 3.11, 3.12, 3.13 only, not 3.10; "
        "pick one of those [python-sglang]",
    ]


def test_presence_tested_env_and_a_flashinfer_build_that_compiles_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, err = findings(tmp_path, capsys, BASE.replace("  flashinfer: {version: 0.7.2}\n", FI_SOURCE))
    assert rc == 2
    assert err == [
        "stacks/s.yaml:9:5: warning: a flashinfer 0.7.2 source build compiles no CUDA (the wheel is the same "
        "py3-none-any as PyPI's); drop source:, and for kernels in the image set components.flashinfer.aot: "
        "{arches: [...]} [flashinfer-source-noop]",
        "stacks/s.yaml:12:13: error: FLASHINFER_DISABLE_JIT is set: flashinfer 0.7.2 tests it for presence: any "
        'value, "0" too, disables the JIT; remove it to keep the default [env-presence-bool]',
    ]


def test_cmake_options_given_as_env(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = findings(tmp_path, capsys, BASE.replace("  sgl_kernel: {version: 0.4.10}\n", SGL_SOURCE))
    assert rc == 2
    assert err == [
        "stacks/s.yaml:11:13: error: SGL_KERNEL_ENABLE_FP4 is a CMake option of sgl_kernel, not an environment "
        "variable: the build never sees it; move it to components.sgl_kernel.source.cmake [cmake-option-env]",
    ]


@pytest.mark.parametrize(
    ("cuda", "index", "want"),
    [
        ("13.0.1", "cu126", "use the cu130 index"),
        # 12.8 with torch 2.14: propose cu126 (which torch-wheel accepts), never the cu128 it lacks
        ("12.8.1", "cu130", "use the cu126 index"),
    ],
)
def test_torch_index_proposes_only_an_index_torch_ships(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cuda: str, index: str, want: str
) -> None:
    text = BASE.replace("whl/cu130", f"whl/{index}").replace("13.0.1", cuda)
    rc, err = findings(tmp_path, capsys, text)
    assert rc == 2
    mine = [e for e in err if "[torch-index-cuda]" in e or "[torch-wheel]" in e]
    assert mine == [
        f"stacks/s.yaml:5:28: error: torch index {index} does not match the stack's CUDA {cuda}; {want} "
        "[torch-index-cuda]"
    ]


def test_sglang_boolean_env_by_sglang_s_own_parser(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = findings(tmp_path, capsys, BASE.replace('ALLREDUCE: "1"', 'ALLREDUCE: "on"'))
    assert rc == 2
    assert err == [
        "stacks/s.yaml:14:5: error: server.env: env SGLANG_ENABLE_PCIE_IPC_ALLREDUCE='on': sglang 0.5.23 reads it "
        "as a boolean (true/1/yes/y or false/0/no/n), warns 'Invalid value' and keeps the default; use 1/0 or "
        "true/false [sglang-env-bool]"
    ]


SHIPPED_PATCH = (shipped_dir("stacks") / "patches" / "sglang-0.5.23-sm120-trtllm-allreduce.patch").read_text()
FUSION = BASE.replace("    --tp-size: 8\n", "    --tp-size: 8\n    --flashinfer-allreduce-fusion-backend: auto\n")


def rules_of(tmp_path: Path, text: str, patch: str | None = None) -> list[str]:
    """The rules' findings alone (pure: no wheel, no lock), `patch` as the stack's one patch."""
    if patch is not None:
        text += "patches: [patches/p.patch]\n"
        (tmp_path / "stacks" / "patches").mkdir(parents=True, exist_ok=True)
        (tmp_path / "stacks" / "patches" / "p.patch").write_text(patch)
    root = project(tmp_path, {"s.yaml": text}, lock=False)
    return [str(f).split(": ", 1)[1] for f in check_rules(load_stack("s", root=root))]


@pytest.mark.parametrize(
    ("value", "on"),
    [("1", True), ("true", True), ("YES", True), ("y", True), ("0", False), ("false", False), ("No", False),
     ("n", False), ("on", False), ("", False), (None, False)],
)
def test_env_bool_reads_a_value_as_sglang_does(value: str | None, on: bool) -> None:
    """0.5.23 srt/environ.py:143-150 EnvBool.parse; anything else (and unset) is the default, False here."""
    assert env_bool(value, False) is on
    assert env_bool("maybe", True) is True


@pytest.mark.parametrize(("value", "warns"), [("1", True), ("yes", True), ("0", False), ("false", False),
                                              ("no", False)])
def test_the_trtllm_patch_displaces_pcie_ipc_only_when_the_env_is_on(
    tmp_path: Path, value: str, warns: bool
) -> None:
    text = BASE.replace('ALLREDUCE: "1"', f'ALLREDUCE: "{value}"')
    assert any("[patch-trtllm-displaces-ipc]" in f for f in rules_of(tmp_path, text, SHIPPED_PATCH)) is warns


def test_the_fusion_rule_reads_what_a_patch_changes_not_which_file(tmp_path: Path) -> None:
    gate = "sglang/srt/layers/flashinfer_comm_fusion.py"
    assert lifted_gates(SHIPPED_PATCH) == {gate}
    comment_only = (
        f"--- a/{gate}\n+++ b/{gate}\n@@ -45,3 +45,4 @@\n \n def _resolve_backend(backend: str, is_multi_node: bool "
        '= False) -> str:\n     """Resolve the requested FlashInfer allreduce fusion backend."""\n+    # SM120: see '
        "the stackbuild notes\n"
    )
    assert lifted_gates(comment_only) == set()
    found = rules_of(tmp_path / "a", FUSION, comment_only)
    assert [f.rsplit(" [", 1)[1] for f in found] == ["sm120-fusion-patch]"]
    assert not [f for f in rules_of(tmp_path / "b", FUSION, SHIPPED_PATCH) if "sm120-fusion" in f]


def test_a_release_newer_than_any_read_is_unknown_not_fine(tmp_path: Path) -> None:
    text = FUSION.replace("sglang: {version: 0.5.23}", "sglang: {version: 0.5.24}")
    assert [f for f in rules_of(tmp_path, text) if "sm120-fusion" in f] == [
        "warning: --flashinfer-allreduce-fusion-backend on sm_120: whether sglang 0.5.24 runs allreduce fusion on "
        "SM120 is unknown (stackbuild has read its gate up to 0.5.23); check srt/layers/flashinfer_comm_fusion.py "
        "and communicator.py of 0.5.24 [sm120-fusion-unknown]"
    ]


def test_the_fusion_rule_says_what_each_release_does(tmp_path: Path) -> None:
    text = FUSION.replace("13.0.1", "12.8.1").replace("cu130", "cu126").replace("0.5.23", "0.5.10.post1")
    assert [f for f in rules_of(tmp_path, text) if "[sm120-fusion-patch]" in f] == [
        "error: --flashinfer-allreduce-fusion-backend on sm_120: sglang 0.5.10.post1 turns it off without a word "
        "(srt/layers/communicator.py:96-110 apply_flashinfer_allreduce_fusion needs SM90 or SM100); drop it (fused "
        "allreduce+RMSNorm is gated to SM90/SM100 in add_norm.py) or add a patch that lets SM120 through that "
        "gate, like stacks/patches/sglang-0.5.23-sm120-trtllm-allreduce.patch (FlashInfer's plain trtllm "
        "allreduce only) [sm120-fusion-patch]"
    ]
