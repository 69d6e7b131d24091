"""FlashInfer's AOT kernels in the image: the spec knob and its rules, the rendered stage, the in-image driver
(run here against a fake flashinfer with the same interface), and the smoke test's reading of the modules."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from helpers_spec import BASE, project, run_cli

from stackbuild.image.smoke import aot_problems, aot_scan_argv
from stackbuild.paths import shipped_dir
from stackbuild.render.lockctx import aot_builds
from stackbuild.render.stack import render_stack
from stackbuild.spec.conditions import aot_arch_for
from stackbuild.spec.load import load_stack

ROOT = shipped_dir("stacks").parent
PLAIN = "  flashinfer: {version: 0.7.2}\n"


def with_aot(arches: str, text: str = BASE) -> str:
    return text.replace(PLAIN, f"  flashinfer: {{version: 0.7.2, aot: {{arches: {arches}}}}}\n")


def findings(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> tuple[int, list[str]]:
    root = project(tmp_path, {"s.yaml": text})
    rc, err, _ = run_cli(capsys, "--root", str(root), "validate", "s")
    return rc, [e for e in err if not e.startswith("stackbuild:")]


@pytest.mark.parametrize(
    ("arch", "cuda", "word"),
    [
        ("sm_120", (13, 0), "12.0f"),
        ("sm_120", (12, 8), "12.0a"),
        ("sm_121", (12, 9), "12.1a"),
        ("sm_100", (12, 8), "10.0a"),
        ("sm_90", (12, 4), "9.0a"),
        ("sm_89", (12, 4), "8.9"),
        ("gfx942", (13, 0), None),
    ],
)
def test_aot_arch_for_follows_flashinfers_normalisation(arch: str, cuda: tuple[int, int], word: str | None) -> None:
    assert aot_arch_for(arch, cuda) == word


def test_aot_arches_are_flashinfer_words(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = findings(tmp_path, capsys, with_aot("[sm_120]"))
    assert (rc, err) == (
        2,
        [
            "stacks/s.yaml:7:46: error: components.flashinfer.aot.arches: flashinfer arch 'sm_120' must look like "
            "'12.0f', '10.0a' or '9.0' (as in FLASHINFER_CUDA_ARCH_LIST) (got list) [type]"
        ],
    )


def test_aot_only_on_flashinfer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = BASE.replace(
        "  sgl_kernel: {version: 0.4.10}\n", '  sgl_kernel: {version: 0.4.10, aot: {arches: ["12.0f"]}}\n'
    )
    rc, err = findings(tmp_path, capsys, text)
    assert (rc, err) == (2, ["stacks/s.yaml:6:33: error: components.sgl_kernel.aot: unknown key 'aot' [unknown-key]"])


def test_family_arch_needs_cuda_12_9(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = with_aot('["12.0f"]', BASE.replace('cuda: "13.0.1"', 'cuda: "12.8.1"'))
    text = text.replace("cuda:13.0.1-cudnn", "cuda:12.8.1-cudnn").replace("cu130", "cu128")
    rc, err = findings(tmp_path, capsys, text)
    assert rc == 2
    assert (
        "stacks/s.yaml:7:47: error: FLASHINFER_CUDA_ARCH_LIST '12.0f' needs CUDA >= 12.9 (stack has 12.8.1); "
        "use '12.0a' [flashinfer-arch]" in err
    )


def test_aot_must_cover_the_stack_arches(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = findings(tmp_path, capsys, with_aot('["10.0a"]'))
    assert (rc, err) == (
        2,
        [
            "stacks/s.yaml:7:38: error: flashinfer AOT builds 10.0a but the stack targets sm_120, which would JIT "
            "at first use; add '12.0f' [flashinfer-aot-cover]"
        ],
    )


def test_aot_needs_nvcc_in_the_base(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err = findings(tmp_path, capsys, with_aot('["12.0f"]', BASE.replace("cudnn-devel", "cudnn-runtime")))
    assert (rc, err) == (
        2,
        [
            "stacks/s.yaml:7:32: error: flashinfer aot: it needs nvcc, which "
            f"nvidia/cuda:13.0.1-cudnn-runtime-ubuntu24.04@sha256:{'5e' * 32} lacks: use a -devel- base "
            "[flashinfer-aot-build]"
        ],
    )


def test_aot_stage_renders_only_when_asked() -> None:
    with_ = render_stack(load_stack("cuda13", root=ROOT)).files
    assert with_["flashinfer_aot.py"] == (ROOT / "templates" / "flashinfer_aot.py").read_text()
    d = aot_builds(load_stack("cuda13", root=ROOT))["flashinfer"].dir
    assert d == "/opt/venv/lib/python3.12/site-packages/flashinfer/data/aot"
    assert f"COPY --from=flashinfer-aot {d} {d}\n" in with_["Dockerfile"]
    assert 'ENV FLASHINFER_CUDA_ARCH_LIST="12.0f" \\\n' in with_["Dockerfile"]
    without = render_stack(load_stack("cuda12.8", root=ROOT)).files
    assert "flashinfer_aot.py" not in without
    assert "flashinfer-aot" not in without["Dockerfile"]


# --- the in-image driver, against a fake flashinfer with the interface it uses -------------------------

FAKE_ENV = """\
import pathlib
_root = pathlib.Path(__file__).resolve().parents[1]
FLASHINFER_DATA = _root / "data"
FLASHINFER_AOT_DIR = _root / "data" / "aot"
"""
FAKE_AOT = """\
import json, os, pathlib
def compile_and_package_modules(out_dir, build_dir, project_root, config=None, verbose=False, skip_prebuilt=True):
    seen = {rel: os.path.realpath(project_root / rel) for rel in
            ("csrc", "include", "3rdparty/cutlass", "3rdparty/spdlog", "3rdparty/cccl")}
    print("CALL " + json.dumps({"out": str(out_dir), "build": str(build_dir), "links": seen,
                                "config": config, "skip_prebuilt": skip_prebuilt,
                                "arches": os.environ["FLASHINFER_CUDA_ARCH_LIST"]}))
    for name in os.environ.get("FAKE_MODULES", "").split():
        (out_dir / name).mkdir(parents=True, exist_ok=True)
        (out_dir / name / f"{name}.so").write_bytes(b"\\x7fELF")
"""


def fake_flashinfer(tmp: Path) -> Path:
    site = tmp / "site"
    pkg = site / "flashinfer"
    (pkg / "jit").mkdir(parents=True)
    for sub in ("csrc", "include", "cutlass", "spdlog", "cccl"):
        (pkg / "data" / sub).mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "jit" / "__init__.py").write_text("")
    (pkg / "jit" / "env.py").write_text(FAKE_ENV)
    (pkg / "aot.py").write_text(FAKE_AOT)
    return site


def run_driver(site: Path, aot: Path, build: Path, **env: str) -> subprocess.CompletedProcess[str]:
    script = ROOT / "templates" / "flashinfer_aot.py"
    return subprocess.run(
        [sys.executable, str(script), str(aot), str(build)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(site), **env},
        check=False,
    )


def test_driver_builds_from_the_wheels_sources_into_the_runtimes_aot_dir(tmp_path: Path) -> None:
    site = fake_flashinfer(tmp_path)
    aot, build = site / "flashinfer" / "data" / "aot", tmp_path / "build"
    r = run_driver(site, aot, build, FLASHINFER_CUDA_ARCH_LIST="12.0f", FAKE_MODULES="norm page")
    assert r.returncode == 0, r.stderr
    call = json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("CALL "))[5:])
    data = (site / "flashinfer" / "data").resolve()
    assert call == {
        "out": str(aot),
        "build": str(build / "aot"),
        "links": {
            "csrc": str(data / "csrc"),
            "include": str(data / "include"),
            "3rdparty/cutlass": str(data / "cutlass"),
            "3rdparty/spdlog": str(data / "spdlog"),
            "3rdparty/cccl": str(data / "cccl"),
        },
        "config": None,
        "skip_prebuilt": False,
        "arches": "12.0f",
    }
    assert r.stdout.splitlines()[-1] == f"AOT 2 modules for 12.0f in {aot}"


def test_driver_refuses_a_dir_the_runtime_does_not_read(tmp_path: Path) -> None:
    site = fake_flashinfer(tmp_path)
    r = run_driver(site, tmp_path / "elsewhere", tmp_path / "b", FLASHINFER_CUDA_ARCH_LIST="12.0f", FAKE_MODULES="x")
    assert r.returncode == 1
    assert r.stderr.strip() == (
        f"flashinfer loads AOT modules from {site / 'flashinfer' / 'data' / 'aot'}, not {tmp_path / 'elsewhere'}"
    )


def test_driver_fails_when_nothing_was_built_or_no_arch_is_set(tmp_path: Path) -> None:
    site = fake_flashinfer(tmp_path)
    aot = site / "flashinfer" / "data" / "aot"
    r = run_driver(site, aot, tmp_path / "b", FLASHINFER_CUDA_ARCH_LIST="12.0f")
    assert (r.returncode, r.stderr.strip()) == (1, f"flashinfer's AOT build wrote no modules to {aot}")
    r = run_driver(site, aot, tmp_path / "b")
    assert (r.returncode, r.stderr.strip()) == (1, "FLASHINFER_CUDA_ARCH_LIST is not set")


# --- the smoke test's reading of the modules in the image ------------------------------------------------


def container(*entries: tuple[int, int]) -> bytes:
    body = b""
    for kind, arch in entries:
        head = struct.pack("<HHIQIIHHI", kind, 0x0101, 64, 8, 0, 0, 0, 0, arch)
        body += head + b"\0" * (64 - len(head)) + b"\0" * 8
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def test_scan_runs_standalone_and_reads_each_module(tmp_path: Path) -> None:
    for name, blob in {
        "norm": container((2, 120)),
        "page": container((1, 90)),
        "host": b"\x7fELF" + b"\0" * 64,
    }.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / f"{name}.so").write_bytes(b"\x7fELF" + b"\0" * 60 + blob)
    argv = aot_scan_argv(str(tmp_path))
    # -I: no PYTHONPATH, no site-packages; the script carries its own reader, as in an image without builder
    r = subprocess.run([sys.executable, "-I", *argv[1:]], capture_output=True, text=True, check=True)
    assert r.stdout.splitlines() == [
        'AOTMOD ["host", [], []]',
        'AOTMOD ["norm", [120], []]',
        'AOTMOD ["page", [], [90]]',
    ]


def test_aot_problems_name_modules_without_a_kernel_for_the_target() -> None:
    out = "noise\n" + "\n".join(
        f"AOTMOD {json.dumps(m)}" for m in (["a", [120], []], ["b", [100], []], ["c", [], [90]], ["d", [], []])
    )
    assert aot_problems(out, [120], "/x", "FlashInfer") == (
        ["1 of 4 FlashInfer AOT modules carry no sm_120 kernel: b"],
        "4 FlashInfer AOT modules (3 with GPU code; SASS sm_100, sm_120)",
    )
    assert aot_problems(out, [100], "/x", "FlashInfer")[0] == [
        "1 of 4 FlashInfer AOT modules carry no sm_100 kernel: a"
    ]


def test_aot_problems_when_the_image_has_none() -> None:
    assert aot_problems("", [120], "/x", "FlashInfer") == (
        ["no FlashInfer AOT modules in /x: the first start would JIT-compile them"],
        "",
    )


@pytest.mark.integration
def test_smoke_reads_the_aot_modules_inside_a_real_image(docker_client: Any, tmp_path: Path) -> None:
    """The scan travels as `python3 -c` argv into a container of an image with no builder and no pyelftools."""
    from conftest import TESTHOST_IMAGE, _require_image

    from stackbuild.image import smoke

    stack = load_stack("cuda13", root=ROOT)
    build = aot_builds(stack)["flashinfer"]
    where = build.dir
    mods = {"norm": container((2, 120)), "sm100_only": container((2, 100)), "host": b""}
    for name, blob in mods.items():
        (tmp_path / "aot" / name).mkdir(parents=True)
        (tmp_path / "aot" / name / f"{name}.so").write_bytes(b"\x7fELF" + b"\0" * 60 + blob)
    (tmp_path / "Dockerfile").write_text(f"FROM {_require_image(docker_client, TESTHOST_IMAGE)}\nCOPY aot {where}\n")
    tag = f"wt11b-aot-smoke:{uuid.uuid4().hex[:8]}"
    docker_client.images.build(path=str(tmp_path), tag=tag, network_mode="none", rm=True)
    try:
        done: list[str] = []
        problems = smoke._aot_check(docker_client, tag, stack, build, done)
        assert problems == ["1 of 3 FlashInfer AOT modules carry no sm_120 kernel: sm100_only"]
        done = []
        assert smoke._aot_check(docker_client, TESTHOST_IMAGE, stack, build, done) == [
            f"no FlashInfer AOT modules in {where}: the first start would JIT-compile them"
        ]
    finally:
        docker_client.images.remove(tag, force=True)


def test_a_changed_build_script_is_a_new_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stackbuild.render import lockctx

    stack = load_stack("cuda13", root=ROOT)
    h0 = render_stack(stack).content_hash
    for name in ("flashinfer_aot.py", "verify_image.py"):
        shutil.copytree(ROOT / "templates", tmp_path / name)
        (tmp_path / name / name).write_text((ROOT / "templates" / name).read_text() + "# changed\n")
        monkeypatch.setattr(lockctx, "templates_dir", lambda d=tmp_path / name: d)
        assert render_stack(stack).content_hash != h0, name
    monkeypatch.setattr(lockctx, "templates_dir", lambda: ROOT / "templates")
    assert render_stack(stack).content_hash == h0


def test_build_args_give_the_aot_stage_flashinfers_job_budget() -> None:
    from stackbuild.image.context import build_args

    cuda13 = render_stack(load_stack("cuda13", root=ROOT)).files["Dockerfile"]
    assert "ARG AOT_MAX_JOBS=4\n" in cuda13
    assert build_args(cuda13, load_stack("cuda13", root=ROOT), 64, 128 << 30) == {
        "MAX_JOBS": "32",  # 128 GiB / 4 GiB
        "NVCC_THREADS": "1",
        "AOT_MAX_JOBS": "16",  # 128 GiB / 8 GiB
    }
    cuda128 = load_stack("cuda12.8", root=ROOT)
    plain = render_stack(cuda128).files["Dockerfile"]
    assert build_args(plain, cuda128, 64, 128 << 30) == {"MAX_JOBS": "32", "NVCC_THREADS": "1"}
    assert build_args("FROM x\n", cuda128, 64, 128 << 30) == {}
