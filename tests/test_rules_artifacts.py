"""Rules grounded in what the real artifacts say: each case gives the exact located line and rule id."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers_spec import BASE, project, run_cli, source_component

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
        "stacks/s.yaml:14:5: error: server.env: env SGLANG_ENABLE_PCIE_IPC_ALLREDUCE='on': sglang 0.5.23 parses "
        "it as a boolean and raises on that value; use 1/0 or true/false [sglang-env-bool]"
    ]
