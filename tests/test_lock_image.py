"""The image side of the lock: source-build stages, the in-image verifier, the GPU-less smoke checks."""

from __future__ import annotations

import importlib.metadata as md
import shutil
import subprocess
import sys
from pathlib import Path

from helpers_spec import BASE, parse_with_stand_in, project, source_component

from stackbuild.image import smoke
from stackbuild.paths import shipped_dir
from stackbuild.render.stack import render_stack
from stackbuild.spec.load import load_stack
from stackbuild.spec.lock import verify
from stackbuild.spec.lock.resolve import header, seal
from stackbuild.spec.lock.target import build_lock_path, lock_path, target_of

ROOT = shipped_dir("stacks").parent
SGL_SOURCE = source_component(
    "sgl_kernel",
    "0.4.10",
    "https://github.com/sgl-project/sglang.git",
    "v0.5.23",
    'cmake: {SGL_KERNEL_ENABLE_FP4: "ON"}',
)


def test_source_build_stage_installs_its_locked_backend_at_the_locked_commit(tmp_path: Path) -> None:
    root = project(tmp_path, {"s.yaml": BASE.replace("  sgl_kernel: {version: 0.4.10}\n", SGL_SOURCE)})
    stack = load_stack("s", root=root)
    t = target_of(stack)
    assert t is not None and t.build_tools == ("cmake==3.31.6", "scikit-build-core==0.11.5")
    lock_path(stack).write_text(seal(header(t, "s", [], {"sglang-kernel": "c0ffee" * 6 + "c0ff"})))
    tools = "cmake==3.31.6 \\\n    --hash=sha256:" + "e" * 64 + "\n"
    build_lock_path(stack).write_text(seal(header(t, "s", []) + tools))
    rendered = render_stack(load_stack("s", root=root))
    assert rendered.files["build-tools.lock"] == build_lock_path(stack).read_text()
    dockerfile = rendered.files["Dockerfile"]
    stages = dockerfile.split("\n\nFROM ")
    assert stages[2:4] == [
        "deps AS sgl-kernel\n"
        "ENV FLASHINFER_NVCC_THREADS=${NVCC_THREADS}\n"
        "COPY build-tools.lock /opt/stackbuild/\n"
        "RUN --mount=type=cache,target=/root/.cache/pip \\\n"
        "    --mount=type=cache,target=/root/.cache/ccache \\\n"
        "    pip install --require-hashes --no-deps --only-binary=:all: -r /opt/stackbuild/build-tools.lock \\\n"
        "    && git clone --depth 1 --branch v0.5.23 --recurse-submodules --shallow-submodules \\\n"
        "       https://github.com/sgl-project/sglang.git /src/sgl_kernel \\\n"
        '    && { test "$(git -C /src/sgl_kernel rev-parse HEAD)" = ' + "c0ffee" * 6 + "c0ff \\\n"
        "         || { echo 'sgl_kernel: source.ref no longer names the locked commit; run stackbuild lock s' >&2; "
        "exit 1; }; } \\\n"
        "    && pip wheel --no-build-isolation --no-deps --wheel-dir /wheels/sgl_kernel \\\n"
        "       --config-settings=cmake.define.SGL_KERNEL_ENABLE_FP4=ON \\\n"
        "       --config-settings=cmake.define.SGL_KERNEL_COMPILE_THREADS=${NVCC_THREADS} \\\n"
        "       /src/sgl_kernel/sgl-kernel \\\n"
        "    && rm -rf /src/sgl_kernel",
        "deps AS runtime\n"
        "COPY --from=sgl-kernel /wheels/sgl_kernel /wheels/sgl_kernel\n"
        "RUN pip install --no-cache-dir --no-deps /wheels/*/*.whl\n"
        "RUN pip check \\\n"
        "    && python /opt/stackbuild/verify_image.py /opt/stackbuild/requirements.lock 13\n"
        "EXPOSE 30000\n"
        'CMD ["python", "-m", "sglang.launch_server", "--help"]\n' + dockerfile.split('"--help"]\n', 1)[1],
    ]
    (tmp_path / "Dockerfile").write_text(dockerfile)
    hadolint = shutil.which("hadolint")
    assert hadolint
    cp = subprocess.run([hadolint, "--no-color", str(tmp_path / "Dockerfile")], capture_output=True, text=True)
    assert (cp.returncode, cp.stdout) == (0, "")


def test_verify_image_names_each_version_that_is_not_the_locked_one(tmp_path: Path) -> None:
    have = md.version("pyyaml")
    lock = tmp_path / "requirements.lock"
    lock.write_text(
        "# built from source in the image, installed from its build stage (not from this file): "
        f"jinja2=={md.version('jinja2')}\n"
        f"pyyaml=={have} \\\n    --hash=sha256:{'a' * 64}\n"
        "click==0.0.1 \\\n    --hash=sha256:" + "b" * 64 + "\n"
        "not-installed-anywhere==1.0\n"
    )
    verifier = ROOT / "templates" / "verify_image.py"
    cp = subprocess.run([sys.executable, str(verifier), str(lock), "none"], capture_output=True, text=True)
    assert cp.returncode == 1
    assert cp.stdout.splitlines() == [
        f"MISMATCH click is {md.version('click')}, the lock says 0.0.1",
        "MISMATCH not-installed-anywhere is missing, the lock says 1.0",
        "VERIFIED 2/4 locked distributions",
    ]


def test_smoke_checks_a_gpu_image_without_importing_its_kernels() -> None:
    stack = load_stack("cuda13", root=ROOT)
    assert smoke.imports(stack) == []
    assert smoke.imports(stack, gpu=True) == ["torch", "sgl_kernel", "flashinfer", "sglang"]
    argv = smoke.parser_argv(stack)
    assert argv[:3] == ["python3", "-c", smoke.PARSER_SCRIPT]
    assert argv[3:7] == ["--model-path", "/models/Qwen3.5-397B-A17B-NVFP4", "--served-model-name", "qwen3.5-397b"]
    assert "allow_abbrev=False" in smoke.PARSER_SCRIPT
    assert smoke.verify_argv("13.0") == [
        "python3",
        "/opt/stackbuild/verify_image.py",
        "/opt/stackbuild/requirements.lock",
        "13.0",
    ]
    assert smoke.verify_problems(1, "MISMATCH torch is 2.9.1, the lock says 2.14.1\nVERIFIED 0/1\n") == [
        "torch is 2.9.1, the lock says 2.14.1"
    ]
    assert smoke.verify_problems(0, "VERIFIED 3/3 locked distributions\n") == []
    assert smoke.verify_problems(2, "Traceback...\nNo such file") == [
        "verify_image.py exited 2: Traceback...\nNo such file"
    ]


def test_a_source_built_torch_is_what_the_other_source_builds_compile_against(tmp_path: Path) -> None:
    torch = source_component(
        "torch", "2.14.1", "https://github.com/pytorch/pytorch.git", "v2.14.1", 'env: {USE_CUDA: "1"}'
    )
    text = BASE.replace('  torch: {version: 2.14.1, index: "https://download.pytorch.org/whl/cu130"}\n', torch)
    root = project(tmp_path, {"s.yaml": text.replace("  sgl_kernel: {version: 0.4.10}\n", SGL_SOURCE)})
    dockerfile = render_stack(load_stack("s", root=root)).files["Dockerfile"]
    froms = [ln for ln in dockerfile.splitlines() if ln.startswith(("FROM ", "COPY --from"))]
    assert froms[1:] == [
        "FROM base AS deps",
        "FROM deps AS torch",
        "FROM torch AS sgl-kernel",
        "FROM deps AS runtime",
        "COPY --from=torch /wheels/torch /wheels/torch",
        "COPY --from=sgl-kernel /wheels/sgl_kernel /wheels/sgl_kernel",
    ]
    assert "    && pip install --no-deps /wheels/torch/*.whl \\\n" in dockerfile
    lock = (root / "stacks" / "locks" / "s.txt").read_text()
    assert "(not from this file): torch==2.14.1, sglang-kernel==0.4.10\n" in lock  # fixed inputs, not emitted


def test_parser_script_parses_with_the_servers_own_arguments_and_refuses_abbreviations(tmp_path: Path) -> None:
    """A stand-in for sglang's ServerArgs.add_cli_args (its real one imports torch): the script must use it,
    parse exactly the rendered argv, and refuse prefixes argparse would otherwise accept."""
    assert smoke.PARSER_SCRIPT == verify.PARSER_SCRIPT  # the smoke test and `lock --verify` parse alike
    fields = "for f in ('--model-path', '--served-model-name', '--host', '--port', '--tp-size'):\n    p.add_argument(f)"

    def parse(*args: str) -> subprocess.CompletedProcess[str]:
        return parse_with_stand_in(tmp_path, fields, *args)

    ok = parse("--model-path", "/m", "--port", "30000", "--tp-size", "8")
    assert (ok.returncode, ok.stdout) == (0, "SERVER-ARGS-OK\n")
    bad = parse("--model-path", "/m", "--tp", "8")
    assert bad.returncode == 2 and "unrecognized arguments: --tp 8" in bad.stderr
