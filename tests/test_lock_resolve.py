"""The lock's pure core: target, uv argv, lock parsing, wheel choice, and the findings validate prints."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers_spec import BASE, project, run_cli, write_empty_lock
from packaging.tags import Tag

from stackbuild.paths import shipped_dir
from stackbuild.spec.load import load_stack
from stackbuild.spec.lock import check, resolve, target, wheels
from stackbuild.spec.lock.audit import WheelAudit, dump_committed

ROOT = shipped_dir("stacks").parent

# A lock body in uv's format: multi-line and single-line `# via`, hashes, index annotations.
BODY = """\
--index-url https://pypi.org/simple

nvidia-cuda-runtime==13.0.96 \\
    --hash=sha256:{a} \\
    --hash=sha256:{b}
    # via torch
    # from https://pypi.org/simple
sglang==0.5.23 \\
    --hash=sha256:{c}
    # via -r requirements.in
    # from https://pypi.org/simple
torch==2.14.1 \\
    --hash=sha256:{d}
    # via
    #   -r requirements.in
    #   sglang
    # from https://pypi.org/simple
""".format(a="a" * 64, b="b" * 64, c="c" * 64, d="d" * 64)

CUDA128 = BASE.replace("nvidia/cuda:13.0.1", "nvidia/cuda:12.8.1").replace('cuda: "13.0.1"', 'cuda: "12.8.1"')
CUDA128 = CUDA128.replace(
    '  torch: {version: 2.14.1, index: "https://download.pytorch.org/whl/cu130"}\n', "  torch: {version: 2.14.1}\n"
)


def test_target_of_the_shipped_cuda13_stack() -> None:
    t = target.target_of(load_stack("cuda13", root=ROOT))
    assert t == target.Target(
        python="3.12",
        platform="x86_64-manylinux_2_39",
        requirements=("torch==2.14.1", "sglang-kernel==0.4.10", "flashinfer-python==0.7.2", "sglang==0.5.23"),
        source_built=(),
        index_url="https://pypi.org/simple",
        extra_index_urls=(),
        exclude_newer="2026-11-12T00:00:00Z",
        constraints=("nvidia-cuda-nvcc<13.1", "nvidia-nvjitlink<13.1", "nvidia-cuda-crt<13.1", "nvidia-nvvm<13.1",
                     "nvidia-cuda-cccl<13.1"),
    )
    assert target.target_of(load_stack("sim", root=ROOT)) is None


def test_uv_argv_is_exact() -> None:
    t = target.Target(
        "3.12",
        "x86_64-manylinux_2_39",
        ("torch==2.9.1", "sglang-kernel==0.4.1"),
        ("sglang-kernel==0.4.1",),
        "https://pypi.org/simple",
        ("https://download.pytorch.org/whl/cu128",),
        "2026-04-09T23:59:59Z",
        ("numpy<3",),
    )
    assert resolve.uv_argv(t, Path("r.in"), Path("c.txt"), Path("o.txt"), offline=True) == [
        sys.executable, "-m", "uv", "pip", "compile", "r.in", "-o", "o.txt", "--quiet",
        "--python-version", "3.12", "--python-platform", "x86_64-manylinux_2_39",
        "--generate-hashes", "--emit-index-annotation", "--emit-index-url", "--no-header", "--no-build",
        "--no-python-downloads",
        "--index-url", "https://pypi.org/simple",
        "--extra-index-url", "https://download.pytorch.org/whl/cu128",
        "--exclude-newer", "2026-04-09T23:59:59Z",
        "--constraint", "c.txt",
        "--no-emit-package", "sglang-kernel",
        "--offline",
    ]  # fmt: skip


def test_parse_reads_pins_hashes_index_and_parents() -> None:
    lock = resolve.parse("# inputs-sha256: " + "f" * 64 + "\n" + BODY)
    assert lock.inputs_hash == "f" * 64
    rt = lock.entries["nvidia-cuda-runtime"]
    assert (rt.version, rt.hashes, rt.via) == ("13.0.96", ["a" * 64, "b" * 64], ["torch"])
    assert rt.index == "https://pypi.org/simple"
    assert lock.entries["torch"].via == ["-r", "sglang"]
    # the nearest component wins: torch, not sglang which also pulls torch
    assert lock.roots("nvidia-cuda-runtime", {"torch", "sglang"}) == ["torch"]


def test_choose_picks_the_best_wheel_the_target_installs() -> None:
    t = target.target_of(load_stack("cuda13", root=ROOT))
    assert t is not None
    files = [
        wheels.WheelFile("x-1-cp313-cp313-manylinux_2_28_x86_64.whl", "u1", "1" * 64),
        wheels.WheelFile("x-1-cp312-cp312-manylinux_2_40_x86_64.whl", "u2", "2" * 64),  # newer glibc than 24.04
        wheels.WheelFile("x-1-cp39-abi3-manylinux2014_x86_64.whl", "u3", "3" * 64),
        wheels.WheelFile("x-1-cp312-cp312-manylinux_2_28_x86_64.whl", "u4", "4" * 64),
        wheels.WheelFile("x-1.tar.gz", "u5", "5" * 64),
    ]
    assert wheels.choose(files, t) == files[3]
    assert wheels.choose(files[2:3], t) == files[2]
    assert wheels.choose([files[0], files[1]], t) is None
    assert Tag("py37", "none", "any") in wheels.accepted_tags(t)
    assert files[3].native and not wheels.WheelFile("y-1-py3-none-any.whl", "u", "0" * 64).native


def test_validate_without_a_lock_names_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = project(tmp_path, {"s.yaml": BASE}, lock=False)
    rc, err, _ = run_cli(capsys, "--root", str(root), "validate", "s")
    assert (rc, err) == (
        2,
        [
            "stacks/s.yaml:4:1: error: no lock stacks/locks/s.txt; run `stackbuild lock s` [lock-missing]",
            "stackbuild: 1 error(s), 0 warning(s) in 1 stack(s)",
        ],
    )


def test_a_changed_component_makes_the_lock_stale(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = project(tmp_path, {"s.yaml": BASE})
    (root / "stacks" / "s.yaml").write_text(BASE.replace("{version: 0.4.10}", "{version: 0.4.10}\n  # a comment\n"))
    assert run_cli(capsys, "--root", str(root), "validate", "s")[0] == 0  # same inputs: still fresh
    (root / "stacks" / "s.yaml").write_text(BASE + "lock: {exclude_newer: '2026-11-01T00:00:00Z'}\n")
    rc, err, _ = run_cli(capsys, "--root", str(root), "validate", "s")
    assert rc == 2
    assert err[0] == (
        "stacks/s.yaml:4:1: error: stacks/locks/s.txt was resolved for other inputs (components, python, "
        "platform, indexes); run `stackbuild lock s` [lock-stale]"
    )


def test_the_content_hash_follows_the_lock(tmp_path: Path) -> None:
    from stackbuild.render.stack import render_stack

    root = project(tmp_path, {"s.yaml": BASE})
    h0 = render_stack(load_stack("s", root=root)).content_hash
    write_empty_lock(root, "s", BODY)
    rendered = render_stack(load_stack("s", root=root))
    assert rendered.content_hash != h0
    assert rendered.files["requirements.lock"].endswith(BODY)


def test_today_s_cuda128_stack_fails_on_its_cuda13_closure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """sglang 0.5.23 on a 12.8.1 base: the rule from sglang's metadata and the lock's own packages say it."""
    root = project(tmp_path, {"s.yaml": CUDA128})
    write_empty_lock(root, "s", BODY)
    rc, err, _ = run_cli(capsys, "--root", str(root), "validate", "s")
    assert rc == 2
    assert err[:3] == [
        "stacks/s.yaml:5:3: error: nvidia-cuda-runtime==13.0.96 (pulled in by torch) is a CUDA 13 package, "
        "which needs driver >= 580; this stack is CUDA 12.8.1 (driver >= 570) [lock-cuda-major]",
        "stacks/s.yaml:8:12: error: sglang 0.5.23 requires cuda-python>=13.0 (every sglang from 0.5.11 on): "
        "a CUDA 13 closure (nvidia-cuda-runtime 13, libcudart.so.13) needing driver >= 580, but this stack is "
        "CUDA 12.8.1 (driver >= 570); pin sglang 0.5.10.post1 (the last all-CUDA-12 release) or use a CUDA 13 "
        "base [sglang-cuda13]",
        "stackbuild: 2 error(s), 0 warning(s) in 1 stack(s)",
    ]


def test_audit_findings_are_located_at_the_component(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = project(tmp_path, {"s.yaml": CUDA128})
    monkeypatch.chdir(root)
    body = BODY.replace("nvidia-cuda-runtime==13.0.96", "nvidia-cuda-runtime-cu12==12.8.90")
    stack = load_stack("s", root=root)
    lock = resolve.parse(body)
    audits = {
        "torch": WheelAudit("torch.whl", "d" * 64, 9, {"libcudart.so.13": 13}, [90, 100], []),
        "sglang": WheelAudit("sglang.whl", "c" * 64, 1, {"libcudart.so.11": 11}, [120], []),
    }
    found = [str(f) for f in check.audit_findings(stack, lock, audits)]
    assert found == [
        "stacks/s.yaml:8:3: error: sglang.whl (pulled in by sglang) links libcudart.so.11, which no wheel in the "
        "closure ships (a CUDA 12 base has .so.12): loading it fails with 'cannot open shared object' "
        "[audit-cuda-missing]",
        "stacks/s.yaml:5:3: error: torch.whl (pulled in by torch) links libcudart.so.13: CUDA 13, driver >= 580; "
        "this stack is CUDA 12.8.1 (driver >= 570) [audit-cuda-major]",
        "stacks/s.yaml:5:3: error: torch.whl (pulled in by torch) has no sm_120 SASS (has sm_90, sm_100) and no "
        "PTX it can JIT from (has none): 'no kernel image is available' at run time [audit-arch]",
    ]
    assert dump_committed(audits).startswith('{\n "format": 3')


def test_shipped_stacks_validate_from_committed_files(capsys: pytest.CaptureFixture[str]) -> None:
    rc, err, _out = run_cli(capsys, "--root", str(ROOT), "validate", "--offline", cwd=ROOT)
    assert rc == 0, err
    assert not [e for e in err if ": error: " in e]


def test_a_variant_that_changes_the_closure_has_its_own_lock(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = BASE + "variants:\n  flags-only: {server: {flags: {--enable-metrics: true}}}\n"
    text += "  newer-kernel: {components: {sgl_kernel: {version: 0.4.11}}}\n"
    root = project(tmp_path, {"s.yaml": text})
    assert target.lock_path(load_stack("s", root=root, variant="flags-only")).name == "s.txt"
    newer = load_stack("s", root=root, variant="newer-kernel")
    assert (target.lock_path(newer).name, target.lock_command(newer)) == (
        "s.newer-kernel.txt",
        "stackbuild lock s --variant newer-kernel",
    )
    rc, err, _ = run_cli(capsys, "--root", str(root), "validate", "s")
    assert rc == 2
    want = "no lock stacks/locks/s.newer-kernel.txt; run `stackbuild lock s --variant newer-kernel` [lock-missing]"
    assert [e for e in err if "[lock-missing]" in e] == [f"stacks/s.yaml:20:18: error: {want}"]  # the overlay


def test_uv_no_solution_becomes_one_line() -> None:
    stderr = (
        "error: No solution found when resolving dependencies\n"
        "  cause: Because sglang==0.5.23 has no wheels with a matching Python implementation tag (e.g., `cp310`)\n"
        "\n"
        "hint: You require CPython 3.10 (`cp310`)\n"
    )
    got = resolve.unsatisfiable(stderr)
    assert got is not None and got.about_python
    assert got.reason == (
        "Because sglang==0.5.23 has no wheels with a matching Python implementation tag (e.g., `cp310`) "
        "You require CPython 3.10 (`cp310`)"
    )
    assert resolve.unsatisfiable("error: Failed to fetch: https://pypi.org/simple/x/") is None


def test_toolkit_pieces_newer_than_the_base_warn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = project(tmp_path, {"s.yaml": BASE})
    monkeypatch.chdir(root)
    lock = resolve.parse(BODY.replace("nvidia-cuda-runtime==13.0.96", "nvidia-cuda-nvcc==13.5.37"))
    assert [str(f) for f in check.cuda_packages(load_stack("s", root=root), lock)] == [
        "stacks/s.yaml:5:3: warning: nvidia-cuda-nvcc==13.5.37 (pulled in by torch) is from CUDA 13.5, newer than "
        "the stack's 13.0.1: what it builds as PTX cannot be JIT-compiled by a 13.0.1 driver (SASS runs under "
        "minor-version compatibility); pin it with lock.constraints [lock-cuda-minor]"
    ]
    assert [check.toolkit_release(n, v) for n, v in [("nvidia-nvjitlink-cu12", "12.8.93"), ("torch", "2.9.1")]] == [
        (12, 8),
        None,
    ]
