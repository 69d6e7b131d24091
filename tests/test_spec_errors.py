"""Broken specs: each gives the exact file:line:col, message and rule id, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers_spec import BASE, project, run_cli


def validate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], files: dict[str, str], name: str = "s"
) -> tuple[int, list[str]]:
    root = project(tmp_path, files)
    rc, err, _ = run_cli(capsys, "--root", str(root), "validate", name)
    return rc, err


def test_base_spec_is_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = validate(tmp_path, capsys, {"s.yaml": BASE})
    assert (rc, err) == (0, [])


CASES = [
    pytest.param(
        BASE.replace("arches: [sm_120]", "arches: [sm_120"),
        "stacks/s.yaml:4:11: error: YAML syntax: expected ',' or ']', but got ':'; "
        "fix the YAML at this spot [yaml-syntax]",
        id="yaml-syntax",
    ),
    pytest.param(
        BASE + "sever:\n  port: 1\n",
        "stacks/s.yaml:18:1: error: sever: unknown key 'sever' (did you mean 'server'?) [unknown-key]",
        id="unknown-top-key",
    ),
    pytest.param(
        BASE + "  shm: 1g\n",
        "stacks/s.yaml:18:3: error: runtime.shm: unknown key 'shm' (did you mean 'shm_size'?) [unknown-key]",
        id="unknown-nested-key",
    ),
    pytest.param(
        BASE + "  port: seventy\n",
        "stacks/s.yaml:18:9: error: runtime.port: Input should be a valid integer, unable to parse string "
        "as an integer (got 'seventy') [type]",
        id="wrong-type",
    ),
    pytest.param(
        BASE + "  port: 30000\n  staging_port: 30000\n",
        "stacks/s.yaml:19:17: error: runtime.staging_port: staging_port 30000 is runtime.port too; the candidate "
        "must bind a port the incumbent does not hold: give it another staging_port (got 30000) [type]",
        id="staging-port-is-port",
    ),
    pytest.param(
        BASE.replace("    --tp-size: 8\n", "    --tp-size: 8\n    --weight-version: v2\n"),
        "stacks/s.yaml:13:5: error: server.flags: '--weight-version' is set by stackbuild from the unit's start "
        "(its systemd InvocationID); remove it [reserved-flag]",
        id="identity-flag-reserved",
    ),
    pytest.param(
        BASE.replace("  model_path: /models/m\n", ""),
        "stacks/s.yaml:10:3: error: server.model_path: required key is missing; add it [missing-key]",
        id="missing-key",
    ),
    pytest.param(
        BASE + "patches: [patches/nope.patch]\n",
        None,  # checked separately: the message names a tmp path
        id="missing-file",
    ),
    pytest.param(
        BASE.replace("  tp: 8\n", "  tp: 8\n  tp: 4\n"),
        "stacks/s.yaml:18:3: error: duplicate key 'tp' (YAML keeps only the last one); remove one of them "
        "[duplicate-key]",
        id="duplicate-key",
    ),
    pytest.param(
        BASE.replace("    --tp-size: 8\n", "    --tp-size: 8\n    --cuda-graph-max-bs: 128\n"),
        "stacks/s.yaml:13:5: error: server.flags: '--cuda-graph-max-bs' is ambiguous in sglang 0.5.23 "
        "(did you mean --cuda-graph-max-bs-decode or --cuda-graph-max-bs-prefill?) [sglang-flag]",
        id="ambiguous-flag",
    ),
    pytest.param(
        BASE.replace("    --tp-size: 8\n", "    --tp: 8\n"),
        "stacks/s.yaml:12:5: error: server.flags: '--tp' is only a prefix abbreviation in sglang 0.5.23 "
        "(did you mean --tp-size?) [sglang-flag]",
        id="prefix-flag",
    ),
    pytest.param(
        BASE.replace("    --tp-size: 8\n", "    --tp-size: 8\n    --enable-metrics: 1\n"),
        "stacks/s.yaml:13:5: error: server.flags: '--enable-metrics' is a switch in sglang 0.5.23; write "
        "`--enable-metrics: true` (or remove it) [sglang-flag-value]",
        id="switch-given-value",
    ),
    pytest.param(
        BASE.replace('    SGLANG_ENABLE_PCIE_IPC_ALLREDUCE: "1"\n', '    SGLANG_ENABLE_SPEC_V2: "1"\n'),
        "stacks/s.yaml:14:5: error: server.env: env SGLANG_ENABLE_SPEC_V2 is not read by sglang 0.5.23: it "
        "would be silently ignored; spec v2 is always on for EAGLE/EAGLE3, use --disable-overlap-schedule to "
        "turn overlap off [sglang-env]",
        id="unknown-env",
    ),
    pytest.param(
        BASE.replace('cuda: "13.0.1"', 'cuda: "12.6"')
        .replace("13.0.1-cudnn", "12.6.3-cudnn")
        .replace("cu130", "cu126"),
        "stacks/s.yaml:3:10: error: sm_120 needs CUDA >= 12.8 (stack has 12.6); raise cuda or drop the arch "
        "[arch-cuda]",
        id="sm120-needs-cuda128",
    ),
    pytest.param(
        BASE.replace("cu130", "cu128"),
        "stacks/s.yaml:5:28: error: torch 2.14.1 has no cu128 wheel (it ships cu126, cu130, cu132); build "
        "torch from source or pick another torch [torch-wheel]",
        id="torch-wheel-missing",
    ),
    pytest.param(
        BASE.replace("{version: 0.7.2}", "{version: 0.6.9}"),
        "stacks/s.yaml:7:16: error: flashinfer 0.6.9 disagrees with sglang 0.5.23, which pins 0.7.2; pin "
        "0.7.2 or change sglang [sglang-pins]",
        id="pin-mismatch",
    ),
    pytest.param(
        BASE.replace("    --tp-size: 8\n", "    --tp-size: 8\n    --flashinfer-allreduce-fusion-backend: auto\n"),
        "stacks/s.yaml:13:5: error: --flashinfer-allreduce-fusion-backend on sm_120: sglang 0.5.23 raises "
        "'FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs.' (srt/layers/flashinfer_comm_fusion.py:"
        "46-50 _resolve_backend); drop it (fused allreduce+RMSNorm is gated to SM90/SM100 in add_norm.py) or add "
        "a patch that lets SM120 through that gate, like stacks/patches/sglang-0.5.23-sm120-trtllm-allreduce.patch "
        "(FlashInfer's plain trtllm allreduce only) [sm120-fusion-patch]",
        id="fusion-needs-patch",
    ),
    pytest.param(
        BASE + "gate:\n  profiles:\n    q:\n      within_gate_drift: quadratic\n",
        "stacks/s.yaml:21:26: error: gate.profiles.q.within_gate_drift: Input should be 'none', "
        "'linear' or 'auto' (got 'quadratic') [type]",
        id="gate-within-drift",
    ),
    pytest.param(
        BASE.replace("    --tp-size: 8\n", "    --tp-size: 4\n"),
        "stacks/s.yaml:12:5: error: tensor parallel size and GPUs disagree (flag=4, tp=8); make --tp-size, "
        "runtime.tp and runtime.gpus agree [tp-gpus]",
        id="tp-mismatch",
    ),
]


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_broken_spec(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str | None) -> None:
    rc, err = validate(tmp_path, capsys, {"s.yaml": text})
    assert rc == 2
    if expected is None:
        assert err[0].startswith("stacks/s.yaml:18:11: error: patch file 'patches/nope.patch' not found (looked in ")
        assert err[0].endswith("; add it or fix the path [missing-file]")
    elif "warning" in expected.split(": ")[1]:
        assert expected in err
    else:
        assert err[0] == expected
    assert "Traceback" not in "\n".join(err)
    assert err[-1].startswith("stackbuild: ") and "error(s)" in err[-1]


def test_warnings_alone_exit_zero(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = BASE.replace(
        "    --tp-size: 8\n",
        "    --tp-size: 8\n    --enable-torch-symm-mem: true\n"
        "    --speculative-algorithm: EAGLE3\n    --disable-cuda-graph: true\n",
    )
    rc, err = validate(tmp_path, capsys, {"s.yaml": text})
    assert rc == 0
    assert err == [
        "stacks/s.yaml:13:5: warning: --enable-torch-symm-mem has no effect on sm_120 (capability 12 is not "
        "in sglang's TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES, which has 9 and 10 only) [sm120-symm-mem]",
        "stacks/s.yaml:14:5: warning: speculative decoding without --max-running-requests silently caps the "
        "batch at 48; set it [spec-running-cap]",
        "stacks/s.yaml:15:5: warning: server.flags: '--disable-cuda-graph' is deprecated in sglang 0.5.23; "
        "use --cuda-graph-backend-{decode,prefill}=disabled instead [sglang-deprecated]",
    ]


def test_all_problems_in_one_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = BASE + "  shm: 1g\n  port: x\nsever: {}\n"
    rc, err = validate(tmp_path, capsys, {"s.yaml": text})
    assert rc == 2
    assert [e.split(": error: ")[0] for e in err[:-1]] == [
        "stacks/s.yaml:18:3",
        "stacks/s.yaml:19:9",
        "stacks/s.yaml:20:1",
    ]


def test_extends_missing_parent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = validate(tmp_path, capsys, {"s.yaml": "extends: nowhere\n" + BASE})
    assert rc == 2
    assert err[0] == (
        "stacks/s.yaml:1:10: error: extends: no stack 'nowhere' found; name a stack under "
        "stacks/ or a path relative to this file [extends]"
    )


def test_extends_cycle(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = validate(tmp_path, capsys, {"s.yaml": "extends: t\n" + BASE, "t.yaml": "extends: s\n"})
    assert rc == 2
    assert (
        err[0]
        == "stacks/t.yaml:1:10: error: extends: cycle s.yaml -> t.yaml -> s.yaml; "
        "remove one of the links [extends-cycle]"
    )


def test_error_in_parent_points_into_parent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parent = BASE.replace("  tp: 8\n", "  tp: eight\n")
    rc, err = validate(tmp_path, capsys, {"_p.yaml": parent, "s.yaml": "extends: _p\ndescription: child\n"})
    assert rc == 2
    assert err[0] == (
        "stacks/_p.yaml:17:7: error: runtime.tp: Input should be a valid integer, unable to parse "
        "string as an integer (got 'eight') [type]"
    )


def test_variant_error_points_into_overlay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = BASE + "variants:\n  fast:\n    server:\n      flags:\n        --cuda-graph-max-bs: 64\n"
    rc, err = validate(tmp_path, capsys, {"s.yaml": text})
    assert rc == 2
    assert err[0].startswith("stacks/s.yaml:22:9: error: server.flags: '--cuda-graph-max-bs' is ambiguous")


def test_unknown_variant(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = project(tmp_path, {"s.yaml": BASE + "variants:\n  a: {}\n"})
    rc, err, _ = run_cli(capsys, "--root", str(root), "render", "s", "--variant", "b", "--out", str(tmp_path / "o"))
    assert rc == 2
    assert err[0] == "stacks/s.yaml:18:1: error: unknown variant 'b' (this stack has: a) [variant]"
    assert not (tmp_path / "o").exists()


def test_unknown_stack(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = project(tmp_path, {"s.yaml": BASE})
    rc, err, _ = run_cli(capsys, "--root", str(root), "validate", "nope")
    assert rc == 2
    assert err[0].startswith("nope:1:1: error: no stack named 'nope' (looked in ")


def test_null_removes_an_inherited_key_so_the_default_applies(tmp_path: Path) -> None:
    from stackbuild.spec.load import load_stack

    parent = BASE + "  shm_size: 1g\n" + "variants:\n  bare:\n    server: {flags: {--tp-size: null}}\n"
    child = "extends: _p\nruntime: {shm_size: null}\nserver: {env: {SGLANG_ENABLE_PCIE_IPC_ALLREDUCE: null}}\n"
    root = project(tmp_path, {"_p.yaml": parent, "c.yaml": child})
    stack = load_stack("c", root=root)
    assert stack.runtime.shm_size == "32g"  # the model's default, not the parent's 1g
    assert dict(stack.server.env) == {}
    assert "--tp-size" not in load_stack("c", root=root, variant="bare").server.flags
