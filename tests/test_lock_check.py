"""`lock --check` (offline: is each committed lock still the answer to its spec?) and the source builds'
lock: a `source.ref` resolved to its commit by `git ls-remote` (a real repository made here, file://),
the build tools hash-pinned beside the lock."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers_spec import BASE, project, run_cli, source_component

from stackbuild.errors import InfraError, InputError
from stackbuild.paths import shipped_dir
from stackbuild.spec import sglang
from stackbuild.spec.load import load_stack
from stackbuild.spec.lock import base, resolve, run, source, wheels
from stackbuild.spec.lock.base import BasePin
from stackbuild.spec.lock.target import Target, build_lock_path, target_of
from stackbuild.testing.fake_run import FakeRun

ROOT = shipped_dir("stacks").parent
DATED = BASE + "lock: {exclude_newer: '2026-12-02T00:00:00Z'}\n"
SGL_REPO = "https://github.com/sgl-project/sglang.git"
SGL_SOURCE = source_component("sgl_kernel", "0.4.10", SGL_REPO, "v0.5.23", 'cmake: {SGL_KERNEL_ENABLE_FP4: "ON"}')


def test_every_shipped_lock_is_current(capsys: pytest.CaptureFixture[str]) -> None:
    rc, err, out = run_cli(capsys, "--root", str(ROOT), "lock", "--check")
    assert (rc, err) == (0, [])
    assert out.splitlines() == [
        "cuda12.8: up to date: stacks/locks/cuda12.8.txt, as of 2026-04-09T23:59:59Z",
        "cuda13: up to date: stacks/locks/cuda13.txt, as of 2026-11-12T00:00:00Z",
        "sim: nothing to lock",
    ]
    rc, _, out = run_cli(capsys, "--root", str(ROOT), "lock", "--check", "cuda13", "--variant", "eagle3-topk1")
    assert (rc, out) == (0, "cuda13-eagle3-topk1: up to date: stacks/locks/cuda13.txt, as of 2026-11-12T00:00:00Z\n")


def test_a_changed_input_makes_check_fail_and_name_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = project(tmp_path, {"s.yaml": DATED})
    assert run_cli(capsys, "--root", str(root), "lock", "--check", "s")[:2] == (
        0,
        [],
    )
    (root / "stacks" / "s.yaml").write_text(DATED.replace("2026-12-02", "2026-12-03"))
    rc, err, out = run_cli(capsys, "--root", str(root), "lock", "--check", "s")
    assert (rc, out) == (1, "")
    assert err == [
        "stacks/s.yaml:4:1: error: stacks/locks/s.txt was resolved for other inputs (components, python, platform, "
        "indexes); run `stackbuild lock s` [lock-stale]"
    ]


def test_check_wants_a_date_and_the_release_s_flag_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = project(tmp_path, {"s.yaml": BASE.replace("sglang: {version: 0.5.23}", "sglang: {version: 0.5.99}")})
    rc, err, _ = run_cli(capsys, "--root", str(root), "lock", "--check", "s")
    assert rc == 1
    assert err == [
        "stacks/s.yaml:4:1: warning: lock.exclude_newer is not set: a relock resolves against today's index and "
        "may differ; set it to an instant before this lock was made [lock-date]",
        "stacks/s.yaml:8:3: error: no stacks/locks/sglang-0.5.99.flags.json (sglang 0.5.99's flags and env, for "
        "`validate --offline`); run `stackbuild lock s` [lock-table]",
    ]


def test_a_source_build_needs_its_build_tools_lock(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = project(tmp_path, {"s.yaml": DATED.replace("  sgl_kernel: {version: 0.4.10}\n", SGL_SOURCE)})
    build_lock_path(load_stack("s", root=root)).unlink()
    rc, err, _ = run_cli(capsys, "--root", str(root), "lock", "--check", "s")
    assert (rc, err) == (
        1,
        [
            "stacks/s.yaml:4:1: error: stacks/locks/s.build-tools.txt (the source stages' hash-pinned build tools) "
            "is missing; run `stackbuild lock s` [lock-missing]"
        ],
    )


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> tuple[str, dict[str, str]]:
    """A real repository: a lightweight tag, an annotated tag (its own object, peeled to the commit) and a
    branch that shares its name with a tag, each on its own commit."""
    d = tmp_path / "repo"
    d.mkdir()
    _git("init", "-q", "-b", "main", cwd=d)
    ids = {}
    for n, what in enumerate(("light", "annotated", "both")):
        (d / "f").write_text(str(n))
        _git("add", "f", cwd=d)
        _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", what, cwd=d)
        ids[what] = _git("rev-parse", "HEAD", cwd=d)
    _git("tag", "v1", ids["light"], cwd=d)
    _git("-c", "user.name=t", "-c", "user.email=t@t", "tag", "-a", "v2", "-m", "v2", ids["annotated"], cwd=d)
    _git("tag", "both", ids["light"], cwd=d)
    _git("branch", "both", ids["both"], cwd=d)
    return f"file://{d}", ids


def test_a_ref_resolves_to_the_commit_clone_would_check_out(repo: tuple[str, dict[str, str]]) -> None:
    url, ids = repo
    assert source.resolve_ref(url, "v1") == ids["light"]
    assert source.resolve_ref(url, "v2") == ids["annotated"]  # the commit, not the tag object
    assert source.resolve_ref(url, "both") == ids["both"]  # clone --branch takes the branch first
    assert source.resolve_ref(url, "main") == ids["both"]
    # a commit id names itself once the repository is shown to have it: fetched by id, as the build will
    assert source.resolve_ref(url, ids["annotated"]) == ids["annotated"]
    with pytest.raises(InputError, match=f"^{url} has no commit {'f' * 40}; fix source.ref$"):
        source.resolve_ref(url, "f" * 40)
    with pytest.raises(InputError, match=r"has no branch or tag 'v9'; fix source.ref"):
        source.resolve_ref(url, "v9")


def test_ls_remote_argv_and_output_reading() -> None:
    argv = ["git", "ls-remote", "--", "https://h/r.git", "v1", "v1^{}"]
    assert source.ls_remote_argv("https://h/r.git", "v1") == argv
    out = f"{'a' * 40}\trefs/tags/v1\n{'b' * 40}\trefs/tags/v1^{{}}\n{'c' * 40}\trefs/heads/v1x\n"
    assert source.commit_of(out, "v1") == "b" * 40
    assert source.commit_of(out, "v1x") == "c" * 40
    fake = FakeRun().on(["git", "ls-remote"], returncode=128, stderr="fatal: repository not found")
    with pytest.raises(InfraError, match=r"cannot list the refs of https://h/r\.git"):
        source.resolve_ref("https://h/r.git", "v1", run=fake)


def test_lock_pins_the_source_commit_and_the_build_tools(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`stackbuild lock` end to end with uv and the index replaced by fakes: the header records the commit
    the ref names, the build tools resolve with the closure's pins as constraints into their own file."""
    resolved: list[Target] = []

    def fake_resolve(t: Target, offline: bool = False) -> str:
        resolved.append(t)
        name = t.requirements[0].split("==")[0]
        return f"{t.requirements[0]} \\\n    --hash=sha256:{'e' * 64}\n    # via -r requirements.in\n" + (
            "" if name != "torch" else f"packaging==26.4 \\\n    --hash=sha256:{'f' * 64}\n    # via torch\n"
        )

    monkeypatch.setattr(resolve, "resolve", fake_resolve)
    monkeypatch.setattr(wheels, "locate", lambda e, t: wheels.WheelFile(f"{e.name}-{e.version}-py3-none-any.whl",
                                                                          "https://example.invalid/w", e.hashes[0]))
    monkeypatch.setattr(sglang, "table_of_wheel", lambda v: sglang.committed_table(v))
    monkeypatch.setattr(source, "resolve_ref", lambda repo, ref: "1" * 40)
    root = project(tmp_path, {"s.yaml": DATED.replace("  sgl_kernel: {version: 0.4.10}\n", SGL_SOURCE)}, lock=False)
    rc, err, _ = run_cli(capsys, "--root", str(root), "lock", "s")
    assert rc == 0, err
    assert "sglang-kernel: https://github.com/sgl-project/sglang.git v0.5.23 is " + "1" * 40 in err
    stack = load_stack("s", root=root)
    t = target_of(stack)
    assert t is not None
    lock = (root / "stacks" / "locks" / "s.txt").read_text()
    assert "# source: sglang-kernel https://github.com/sgl-project/sglang.git v0.5.23 " + "1" * 40 + "\n" in lock
    tools = build_lock_path(stack).read_text()
    assert tools.splitlines()[:4] == [
        "# stackbuild build-tools lock for s; do not edit, regenerate with `stackbuild lock s`",
        f"# inputs-sha256: {t.inputs_hash()}",
        f"# content-sha256: {resolve.content_hash(tools)}",
        "# what each source stage installs before its build: cmake==3.31.6 scikit-build-core==0.11.5",
    ]
    assert resolved[1].requirements == ("cmake==3.31.6", "scikit-build-core==0.11.5")
    assert resolved[1].constraints == ()  # resolved apart from the closure: a tool may differ from its pin
    assert resolved[1].exclude_newer == "2026-12-02T00:00:00Z" and resolved[1].platform == t.platform
    assert run_cli(capsys, "--root", str(root), "lock", "--check", "s")[:2] == (0, [])


def test_offline_lock_takes_the_commit_from_the_committed_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = project(tmp_path, {"s.yaml": DATED.replace("  sgl_kernel: {version: 0.4.10}\n", SGL_SOURCE)})
    stack = load_stack("s", root=root)
    t = target_of(stack)
    assert t is not None
    from stackbuild.errors import SpecError

    with pytest.raises(SpecError) as err:
        run._commits(stack, t, offline=True)
    assert str(err.value) == str(root / "stacks") + (
        "/s.yaml:10:12: error: https://github.com/sgl-project/sglang.git v0.5.23 is not in the committed "
        "lock; resolve it once without --offline [lock-source]"
    )
    (root / "stacks" / "locks" / "s.txt").write_text(
        resolve.seal(resolve.header(t, "s", [], {"sglang-kernel": "2" * 40})))
    assert run._commits(load_stack("s", root=root), t, offline=True) == {"sglang-kernel": "2" * 40}


def _shipped_copy(tmp_path: Path) -> Path:
    import shutil

    shutil.copytree(ROOT / "stacks", tmp_path / "stacks")
    return tmp_path


def test_a_hand_edited_pin_is_stale_in_check_and_validate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _shipped_copy(tmp_path)
    lock = root / "stacks" / "locks" / "cuda13.txt"
    text = lock.read_text()
    assert "\nfilelock==4.2.10 \\\n" in text
    lock.write_text(text.replace("\nfilelock==4.2.10 \\\n", "\nfilelock==4.2.9 \\\n"))
    have = resolve.content_hash(lock.read_text())
    said = resolve.parse(text).content_hash
    assert said is not None
    stale = (f"stacks/cuda13.yaml:13:1: error: stacks/locks/cuda13.txt was edited after it was resolved (its pins "
             f"hash to {have[:12]}, its header says {said[:12]}); run `stackbuild lock cuda13` [lock-stale]")
    rc, err, out = run_cli(capsys, "--root", str(root), "lock", "--check", "cuda13")
    assert (rc, err, out) == (1, [stale], "")
    rc, err, _ = run_cli(capsys, "--root", str(root), "validate", "--offline", "cuda13")
    assert rc == 2 and stale in err, err


def test_a_native_pin_that_no_longer_names_its_audited_file_is_stale(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the content hash updated by hand too: the committed audit still records which file was resolved
    root = _shipped_copy(tmp_path)
    lock = root / "stacks" / "locks" / "cuda13.txt"
    lock.write_text(resolve.seal(lock.read_text().replace("\nxxhash==", "\nxxhash==0.0.1.dev0+was-")))
    rc, err, _ = run_cli(capsys, "--root", str(root), "lock", "--check", "cuda13")
    assert rc == 1 and len(err) == 1, err
    assert err[0].startswith("stacks/cuda13.yaml:")
    assert "error: xxhash==0.0.1.dev0+was-" in err[0] and "does not name the file the lock audited (xxhash-" in err[0]
    assert err[0].endswith("the pin was changed after it was resolved; run `stackbuild lock cuda13` [lock-stale]")


def test_a_lock_without_a_content_hash_is_stale(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = _shipped_copy(tmp_path)
    lock = root / "stacks" / "locks" / "cuda12.8.txt"
    lock.write_text("".join(ln for ln in lock.read_text().splitlines(keepends=True)
                            if not ln.startswith("# content-sha256: ")))
    rc, err, _ = run_cli(capsys, "--root", str(root), "lock", "--check", "cuda12.8")
    assert (rc, err) == (1, [
        "stacks/cuda12.8.yaml:13:1: error: stacks/locks/cuda12.8.txt has no content-sha256 in its header (not "
        "written by this stackbuild); run `stackbuild lock cuda12.8` [lock-stale]"])


def test_seal_records_the_content_once_after_the_inputs() -> None:
    text = "# stackbuild lock for s\n# inputs-sha256: " + "a" * 64 + "\n# target: x\nsix==1.0 \\\n    --hash=sha256:" \
        + "b" * 64 + "\n"
    sealed = resolve.seal(text)
    assert sealed.splitlines()[2] == "# content-sha256: " + resolve.content_hash(text)
    assert resolve.seal(sealed) == sealed and resolve.parse(sealed).edited() is None
    assert resolve.content_hash(text) == __import__("hashlib").sha256(b"six==1.0 \\\n    --hash=sha256:" + b"b" * 64
                                                                      + b"\n").hexdigest()


def test_a_commit_ref_is_fetched_by_id_in_the_build(tmp_path: Path) -> None:
    from stackbuild.render.stack import render_stack

    sha = "0123456789abcdef0123456789abcdef01234567"
    root = project(tmp_path, {"s.yaml": DATED.replace("  sgl_kernel: {version: 0.4.10}\n",
                                                      SGL_SOURCE.replace("v0.5.23", sha))})
    dockerfile = render_stack(load_stack("s", root=root)).files["Dockerfile"]
    assert "--branch" not in dockerfile
    assert (
        "    && git init --quiet /src/sgl_kernel \\\n"
        f"    && git -C /src/sgl_kernel fetch --quiet --depth 1 -- {SGL_REPO} {sha} \\\n"
        "    && git -C /src/sgl_kernel checkout --quiet FETCH_HEAD \\\n"
        "    && git -C /src/sgl_kernel submodule update --init --recursive --depth 1 \\\n") in dockerfile
    assert source.fetch_commit_argv("/src/x", SGL_REPO, sha) == [
        "git", "-C", "/src/x", "fetch", "--quiet", "--depth", "1", "--", SGL_REPO, sha]


def test_a_commit_fetch_that_fails_for_another_reason_is_infrastructure() -> None:
    fake = FakeRun().on(["git", "init"]).on(["git", "-C"], returncode=128,
                                            stderr="fatal: unable to access 'https://h/r.git/': Could not resolve host")
    with pytest.raises(InfraError, match=r"cannot fetch a{40} from https://h/r\.git"):
        source.resolve_ref("https://h/r.git", "a" * 40, run=fake)


def test_the_lock_says_whether_its_base_image_is_pinned() -> None:
    t = target_of(load_stack("cuda13", root=ROOT))
    assert t is not None
    tag = "nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04"
    unpinned = BasePin(tag, None, "its registry docker.io did not answer")
    assert f"# base image: {tag} (unpinned: its registry docker.io did not answer; `stackbuild validate cuda13` " \
           "says how to pin it)\n" in resolve.header(t, "cuda13", [], base=unpinned)
    pinned = BasePin(tag, f"sha256:{'ab' * 32}")
    assert f"# base image: {tag}@sha256:{'ab' * 32}\n" in resolve.header(t, "cuda13", [], base=pinned)
    assert base.parse(resolve.header(t, "cuda13", [], base=pinned)) == pinned
    assert base.parse(resolve.header(t, "cuda13", [], base=unpinned)) == unpinned
    shipped = (ROOT / "stacks" / "locks" / "cuda13.txt").read_text()
    assert base.parse(shipped) == unpinned  # Docker Hub does not answer from where the shipped lock was made
