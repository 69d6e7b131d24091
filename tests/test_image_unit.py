"""Pure core of stackbuild.image: CLI choice, exact argv, hashing, parallelism, progress, smoke checks."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from stackbuild.errors import InfraError
from stackbuild.image import buildkit, context, smoke
from stackbuild.image.buildkit import Builder, BuildRequest, CliProbe


def test_buildx_is_preferred_over_builtin_buildkit() -> None:
    probes = [CliProbe("/usr/bin/docker", (20, 10), False), CliProbe("/usr/local/bin/docker", (28, 2), True)]
    assert buildkit.choose_builder(probes) == Builder("/usr/local/bin/docker", True, (28, 2))


def test_new_cli_without_buildx_falls_back_to_old_cli_with_builtin_buildkit() -> None:
    probes = [CliProbe("/usr/local/bin/docker", (28, 2), False), CliProbe("/usr/bin/docker", (20, 10), False)]
    b = buildkit.choose_builder(probes)
    assert b == Builder("/usr/bin/docker", False, (20, 10))
    assert b.description == "/usr/bin/docker 20.10 with built-in BuildKit (DOCKER_BUILDKIT=1)"
    assert b.env({"A": "1"}) == {"A": "1", "DOCKER_BUILDKIT": "1"}


def test_no_buildkit_cli_is_a_clear_error() -> None:
    with pytest.raises(InfraError, match=r"no docker CLI with BuildKit found .* saw: /usr/local/bin/docker"):
        buildkit.choose_builder([CliProbe("/usr/local/bin/docker", (28, 2), False)])


def test_parse_cli_version() -> None:
    assert buildkit.parse_cli_version("Docker version 20.10.24+dfsg1, build 297e128") == (20, 10)
    assert buildkit.parse_cli_version("garbage") is None


def _req(**kw: object) -> BuildRequest:
    base: dict[str, object] = {"context": Path("/ctx"), "tag": "r:t"}
    base.update(kw)
    return BuildRequest(**base)  # type: ignore[arg-type]


def test_build_argv_builtin_buildkit_exact() -> None:
    b = Builder("/usr/bin/docker", False, (20, 10))
    r = _req(
        labels={"z": "1", "a": "2"},
        build_args={"MAX_JOBS": "4"},
        secrets={"hf_token": Path("/s/hf_token")},
        cache_from=("reg:5000/x:buildcache-sim",),
        cache_to="reg:5000/x:buildcache-sim",
        iidfile=Path("/ctx/iid"),
    )
    assert buildkit.build_argv(b, r) == [
        "/usr/bin/docker", "build", "--progress", "plain", "--network", "host", "--file", "/ctx/Dockerfile",
        "--tag", "r:t", "--label", "a=2", "--label", "z=1", "--build-arg", "MAX_JOBS=4",
        "--secret", "id=hf_token,src=/s/hf_token", "--cache-from", "reg:5000/x:buildcache-sim",
        "--build-arg", "BUILDKIT_INLINE_CACHE=1", "--iidfile", "/ctx/iid", "/ctx",
    ]  # fmt: skip


def test_build_argv_buildx_exact() -> None:
    b = Builder("docker", True, (28, 2))
    r = _req(cache_from=("reg/x:c",), cache_to="reg/x:c", no_cache=True, target="runtime")
    assert buildkit.build_argv(b, r) == [
        "docker", "buildx", "build", "--load", "--progress", "plain", "--network", "host",
        "--file", "/ctx/Dockerfile", "--tag", "r:t", "--target", "runtime", "--no-cache",
        "--cache-from", "type=registry,ref=reg/x:c", "--cache-to", "type=registry,ref=reg/x:c,mode=max", "/ctx",
    ]  # fmt: skip


def test_stage_progress_counts_steps_per_stage() -> None:
    sp = buildkit.StageProgress()
    lines = [
        "#1 [internal] load build definition from Dockerfile",
        "#1 DONE 0.0s",
        "#5 [torch 1/2] RUN sleep 30",
        "#6 [sglang 1/3] COPY x /x",
        "#6 CACHED",
        "#5 DONE 30.1s",
        "#7 [torch 2/2] RUN true",
    ]
    changed = [sp.feed(ln) for ln in lines]
    assert changed == [None, None, None, None, "sglang", "torch", None]
    assert sp.stages == {"torch": [1, 2], "sglang": [1, 3]}


def test_context_inputs_only_for_a_wheelhouse_and_keyed_by_sources(tmp_path: Path) -> None:
    assert context.context_inputs("FROM x AS base\nRUN true\n", "3.11") == {}
    root = context.project_root()
    got = context.context_inputs("COPY wheelhouse/app/ /w/\n", "3.11")
    assert got == {
        "wheelhouse/app": context.project_source_hash(root),
        "wheelhouse/deps": context.deps_key("3.11", root),
    }
    assert context.context_inputs("COPY wheelhouse/app/ /w/\n", "3.12")["wheelhouse/deps"] != got["wheelhouse/deps"]


def test_sim_image_hash_covers_the_wheelhouse_and_the_unit_names_that_tag() -> None:
    from stackbuild.render.stack import render_stack
    from stackbuild.spec.load import load_stack

    stack = load_stack("sim")
    plain = render_stack(stack)
    ours = context.rendered_for_image(stack)
    assert ours.content_hash != plain.content_hash
    x, y = ({"wheelhouse/app": v} for v in "xy")
    assert render_stack(stack, x).content_hash != render_stack(stack, y).content_hash
    unit = ours.files["units/stackbuild-sim.service"]
    assert f"stackbuild:sim-{ours.hash12} " in unit
    assert f'dev.stackbuild.hash="{ours.content_hash}"' in ours.files["Dockerfile"]


def test_a_stack_without_wheelhouse_hashes_as_rendered() -> None:
    from stackbuild.render.stack import render_stack
    from stackbuild.spec.load import load_stack

    stack = load_stack("cuda13")
    assert context.rendered_for_image(stack).content_hash == render_stack(stack).content_hash


@pytest.mark.parametrize(
    ("cpus", "mem_gib", "pin_jobs", "pin_threads", "want"),
    [
        (2, 24, None, None, (2, 1)),  # CI: cores bound
        (64, 32, None, None, (8, 1)),  # memory bound: 32 GiB / 4 GiB
        (32, 256, None, None, (16, 2)),  # big box: 2 nvcc threads per job
        (32, 256, 6, None, (6, 2)),  # the spec pins MAX_JOBS
        (32, 256, None, 8, (4, 8)),  # the spec pins nvcc threads: jobs shrink to fit cores
        (1, 2, None, None, (1, 1)),  # never zero
    ],
)
def test_parallelism(cpus: int, mem_gib: int, pin_jobs: int | None, pin_threads: int | None,
                     want: tuple[int, int]) -> None:  # fmt: skip
    p = context.parallelism(cpus, mem_gib << 30, max_jobs=pin_jobs, nvcc_threads=pin_threads)
    assert (p.max_jobs, p.nvcc_threads) == want


@pytest.mark.parametrize(
    ("cpus", "mem_gib", "threads", "pin_jobs", "want"),
    [
        (2, 24, 1, None, 2),  # cores bound
        (64, 32, 1, None, 4),  # memory bound: 32 GiB / 8 GiB per job (flashinfer's budget, not our 4)
        (32, 256, 8, None, 4),  # 8 threads: 16 GiB a job fits 16 jobs, but jobs x threads stay within 32 cores
        (64, 64, 6, None, 5),  # 6 threads: 12 GiB a job
        (32, 256, 2, 6, 6),  # the spec pins MAX_JOBS
        (1, 2, 1, None, 1),  # never zero
    ],
)
def test_aot_jobs_follow_flashinfers_budget(cpus: int, mem_gib: int, threads: int, pin_jobs: int | None,
                                           want: int) -> None:  # fmt: skip
    assert context.aot_jobs(cpus, mem_gib << 30, nvcc_threads=threads, max_jobs=pin_jobs) == want


def test_download_deps_argv_targets_the_image_python() -> None:
    argv = context.download_deps_argv("3.11", Path("/r.txt"), Path("/d"))
    assert argv[:5] == ["python3", "-m", "pip", "download", "--quiet"]
    assert "--only-binary=:all:" in argv
    assert argv[argv.index("--python-version") + 1] == "3.11"
    assert argv[argv.index("--abi") + 1] == "cp311"
    assert "manylinux_2_36_x86_64" in argv or "manylinux_2_36_aarch64" in argv
    assert argv[-4:] == ["--dest", "/d", "-r", "/r.txt"]


def test_needs_wheelhouse() -> None:
    assert context.needs_wheelhouse("COPY wheelhouse/deps/ /wheelhouse/deps/\n")
    assert not context.needs_wheelhouse("FROM x\nRUN pip install sglang\n")


def test_version_mismatches_ignore_local_suffix_and_name_the_mismatch() -> None:
    want = {"torch": "2.14.1", "sglang": "0.5.23", "flashinfer-python": "0.7.2"}
    found = {"torch": "2.14.1+cu130", "sglang": "0.5.22"}
    assert smoke.version_mismatches(want, found) == [
        "flashinfer-python is missing in the image, the lock says 0.7.2",
        "sglang is 0.5.22 in the image, the lock says 0.5.23",
    ]


def test_parse_versions() -> None:
    assert smoke.parse_versions('noise\nVERSIONS={"a": "1"}\n') == {"a": "1"}
    assert smoke.parse_versions("nothing") == {}


def test_flags_missing_requires_the_full_name() -> None:
    help_text = "  --cuda-graph-max-bs-decode N\n  --tp-size TP_SIZE\n  --port PORT"
    assert smoke.flags_missing(help_text, ["--tp-size", "--port", "--cuda-graph-max-bs", "--tp"]) == [
        "--cuda-graph-max-bs",
        "--tp",
    ]


def test_patch_check_reverse_applies_each_patch() -> None:
    argv = smoke.patch_check_command(["a.patch", "b.patch"])
    assert argv[:2] == ["bash", "-c"]
    assert argv[2].count("patch -R --dry-run --batch -p1") == 2
    assert "/opt/stackbuild/patches/b.patch" in argv[2]
    assert 'echo "NOT-APPLIED a.patch"' in argv[2]


def test_versions_script_imports_then_prints_json() -> None:
    code = smoke.versions_script(["torch"], ["torch", "sgl_kernel"])
    assert "importlib.import_module(mod)" in code
    assert "['torch', 'sgl_kernel']" in code
    compile(code, "<smoke>", "exec")


def test_summarize_failure_names_the_step_exit_code_and_cause() -> None:
    tail = [
        "#5 [base 2/2] RUN apt-get install -y nope\n",
        "#5 0.882 Reading package lists...\n",
        "#5 1.034 E: Unable to locate package nope\n",
        "#5 ERROR: executor failed running [/bin/sh -c apt-get install -y nope]: exit code: 100\n",
        "------\n",
        " > [base 2/2] RUN apt-get install -y nope:\n",
    ]
    assert buildkit.summarize_failure(tail) == "at [base 2/2] (exit code 100): E: Unable to locate package nope"
    assert buildkit.summarize_failure(["random\n"]) == "see the log"
    # apt's "E" and ": message" split across lines by its open progress line (seen in a CI run)
    split = [*tail[:1], "#5 3.285 Building dependency tree...E\n", "#5 3.809 Reading state information...\n",
             "#5 3.820 : Unable to locate package nope\n", *tail[3:]]
    assert buildkit.summarize_failure(split) == "at [base 2/2] (exit code 100): E: Unable to locate package nope"
    # or both writes on the progress line, the next progress line after it (another CI run)
    joined = [*tail[:1], "#5 2.866 Building dependency tree...E: Unable to locate package nope\n",
              "#5 3.467 \n", "#5 3.467 Reading state information...\n", *tail[3:]]
    assert buildkit.summarize_failure(joined) == "at [base 2/2] (exit code 100): E: Unable to locate package nope"


def test_one_cache_dir_for_builds_and_sglang_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from stackbuild import paths
    from stackbuild.image import build
    from stackbuild.spec import sglang

    monkeypatch.delenv("STACKBUILD_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert paths.cache_dir() == tmp_path / "stackbuild"
    assert build.cache_dir is context.cache_dir is sglang.cache_dir is paths.cache_dir
    monkeypatch.setenv("STACKBUILD_CACHE_DIR", str(tmp_path / "mine"))
    assert paths.cache_dir() == tmp_path / "mine"


def test_host_kernel_check_imports_the_kernels_on_the_hosts_gpus_only_for_gpu_stacks() -> None:
    from stackbuild.spec.load import load_stack

    argv = smoke.host_kernel_check_argv(load_stack("cuda13"), "r/x@sha256:ab")
    assert argv is not None
    assert argv[:10] == ["docker", "run", "--rm", "--network", "none", "--gpus", "all", "--entrypoint", "python3",
                         "r/x@sha256:ab"]
    assert argv[10:] == ["-c", smoke.versions_script([], ["torch", "sgl_kernel", "flashinfer", "sglang"])]
    assert smoke.host_kernel_check_argv(load_stack("sim"), "r/x@sha256:ab") is None


def test_kernel_check_failure_rejects_the_candidate_with_the_last_line() -> None:
    from stackbuild.errors import GateFailed
    from stackbuild.host import units
    from stackbuild.host.ssh import RemoteResult

    class Host:
        address, dry_run = "h", False

        def __init__(self, rc: int, err: str) -> None:
            self.rc, self.err, self.seen = rc, err, []

        def run(self, argv, *, check=True, timeout=None, what="", changes=True):  # type: ignore[no-untyped-def]
            self.seen.append((list(argv), changes))
            return RemoteResult("x", self.rc, "", self.err)

    ok = Host(0, "")
    assert units.kernel_check(ok, ["docker", "run"]) == "kernels import on the host's GPUs"  # type: ignore[arg-type]
    assert ok.seen == [(["docker", "run"], False)]
    bad = Host(1, "Traceback...\nImportError: libcuda.so.1: cannot open shared object file\n")
    with pytest.raises(GateFailed, match=r"do not import on this host's GPUs: ImportError: libcuda.so.1"):
        units.kernel_check(bad, ["docker", "run"])  # type: ignore[arg-type]


def test_stages_display_says_each_stage_once_all_its_steps_are_done() -> None:
    from stackbuild.image.build import _progress

    said: list[str] = []
    with _progress("stages", said.append) as feed:
        for ln in ["#1 [internal] load build definition from Dockerfile", "#1 DONE 0.0s",
                   "#5 [torch 1/2] RUN sleep 30", "#6 [sglang 1/1] COPY x /x", "#6 CACHED",
                   "#5 DONE 30.1s", "#7 [torch 2/2] RUN true", "#7 DONE 0.2s"]:
            feed(ln)
    assert said == ["built stage sglang (1/1)", "built stage torch (2/2)"]



def test_two_builds_of_one_stack_push_its_cache_tag_one_at_a_time(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    """Two builds of one stack at once (two projects' demos in one CI) each tag the stack's one
    `buildcache-LABEL`, push it and untag it. Unserialized, the first's untag fell inside the
    second's push: "tag does not exist". The fake daemon opens the window wide: the first cache push
    waits for a second tag and the second push for an untag (each at most 0.3 s)."""
    from stackbuild.image import build, engine
    from stackbuild.image import registry as reg

    monkeypatch.setenv("STACKBUILD_CACHE_DIR", str(tmp_path))
    tags: set[str] = set()
    events: list[str] = []
    second_tag, untagged = threading.Event(), threading.Event()
    cache = "r:5000/x:buildcache-sim"

    def tag(_c: object, _src: str, dst: str) -> None:
        tags.add(dst)
        events.append(f"tag {dst}")
        if events.count(f"tag {cache}") == 2:
            second_tag.set()

    def push(_c: object, ref: str) -> str:
        if ref == cache:
            first = f"pushing {cache}" not in events
            events.append(f"pushing {ref}")
            (second_tag if first else untagged).wait(0.3)
            if ref not in tags:
                raise InfraError(f"push of {ref} failed: tag does not exist: {ref}")
        return "sha256:" + "0" * 64

    def untag(_c: object, ref: str) -> None:
        tags.discard(ref)
        events.append(f"untag {ref}")
        untagged.set()

    monkeypatch.setattr(engine, "tag", tag)
    monkeypatch.setattr(engine, "push", push)
    monkeypatch.setattr(engine, "untag", untag)
    monkeypatch.setattr(reg, "manifest_digest", lambda _ref: None)
    errors: list[BaseException] = []

    def one(n: int) -> None:
        plan: Any = SimpleNamespace(ref=f"r:5000/x:sim-{n}", registry="r:5000/x", stack=SimpleNamespace(label="sim"),
                                    builder=SimpleNamespace(buildx=False))
        try:
            build._ensure_pushed(plan, None, lambda _m: None)
        except BaseException as e:  # handed to the test's thread
            errors.append(e)

    threads = [threading.Thread(target=one, args=(n,)) for n in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert errors == []
    assert events == [f"tag {cache}", f"pushing {cache}", f"untag {cache}"] * 2
