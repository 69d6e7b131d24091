"""`lock --verify`: the argv it runs, the interpreter it finds, what it decides from the output, the steps
in order (testing.fake_run's FakeRun stands in for the commands), and, marked `network`, a small real lock
installed and checked for real (the cuda13 closure itself is bench/lock_verify.py's: 11 GB)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers_spec import BASE, parse_with_stand_in, project, run_cli

from stackbuild.errors import InfraError, InputError
from stackbuild.paths import cache_dir, templates_dir
from stackbuild.spec.lock import resolve, target, verify, wheels
from stackbuild.testing.fake_run import FakeRun

PY = f"{sys.version_info.major}.{sys.version_info.minor}"
SHA = "5" * 64


def test_argv_builders_are_the_image_s_own_commands() -> None:
    vpy, links, lock = Path("/w/venv/bin/python"), Path("/w/wheels"), Path("/w/requirements.lock")
    assert verify.venv_argv("/usr/bin/python3.12", Path("/w/venv")) == [
        "/usr/bin/python3.12", "-m", "venv", "--clear", "/w/venv"
    ]  # fmt: skip
    assert verify.install_argv(vpy, links, lock) == [
        "/w/venv/bin/python", "-m", "pip", "install", "--require-hashes", "--no-deps", "--only-binary=:all:",
        "--no-index", "--find-links", "/w/wheels", "--no-cache-dir", "--disable-pip-version-check", "--quiet",
        "-r", "/w/requirements.lock",
    ]  # fmt: skip
    assert verify.check_argv(vpy) == ["/w/venv/bin/python", "-m", "pip", "check"]
    assert verify.versions_argv(vpy, Path("/w/v.py"), lock, "13.0") == [
        "/w/venv/bin/python", "/w/v.py", "/w/requirements.lock", "13.0"
    ]  # fmt: skip
    assert verify.parser_argv(vpy, ["--model-path", "/m"]) == [
        "/w/venv/bin/python", "-c", verify.PARSER_SCRIPT, "--model-path", "/m"
    ]  # fmt: skip


def test_candidates_in_order_path_then_pyenv_newest_first_then_uv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for rel in ("pyenv/versions/3.12.1/bin/python3.12", "pyenv/versions/3.12.10/bin/python3.12",
                "pyenv/versions/3.11.7/bin/python3.11", "uv/cpython-3.12.4-linux-x86_64-gnu/bin/python3.12"):
        (tmp_path / rel).parent.mkdir(parents=True)
        (tmp_path / rel).touch()
    monkeypatch.setenv("UV_PYTHON_INSTALL_DIR", str(tmp_path / "uv"))
    got = verify.candidates("3.12", "/usr/local/bin:/usr/bin", tmp_path / "home", str(tmp_path / "pyenv"))
    assert got == [
        "/usr/local/bin/python3.12",
        "/usr/bin/python3.12",
        f"{tmp_path}/pyenv/versions/3.12.10/bin/python3.12",
        f"{tmp_path}/pyenv/versions/3.12.1/bin/python3.12",
        f"{tmp_path}/uv/cpython-3.12.4-linux-x86_64-gnu/bin/python3.12",
    ]


def test_a_shim_for_another_version_is_passed_over(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """pyenv's shim `python3.12` exists on PATH but exits 127 when 3.12 is not its global version."""
    shim, real = tmp_path / "shims" / "python3.12", tmp_path / "pyenv" / "versions" / "3.12.1" / "bin" / "python3.12"
    for p in (shim, real):
        p.parent.mkdir(parents=True)
        p.touch(mode=0o755)
    monkeypatch.setenv("PATH", str(shim.parent))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "pyenv"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no other python of the user's is tried
    monkeypatch.setenv("UV_PYTHON_INSTALL_DIR", str(tmp_path / "uv"))
    fake = FakeRun().on([str(shim)], 127, stderr="pyenv: python3.12: command not found").on([str(real)], 0, "3.12.1\n")
    assert verify.find_python("3.12", None, run=fake) == verify.Python(str(real), "3.12.1")
    assert fake.calls == [(str(shim), "-c", verify.PROBE), (str(real), "-c", verify.PROBE)]
    with pytest.raises(InfraError) as err:
        verify.find_python("3.12", None, run=FakeRun().on([str(shim)], 127).on([str(real)], 0, "3.11.7\n"))
    assert str(err.value) == (
        "no working python 3.12 with venv found (python3.12 on PATH, under pyenv or uv); install it "
        "(`uv python install 3.12`, or your distro's python3.12 and python3.12-venv) or pass --python PATH"
    )


def test_glibc_each_wheel_needs() -> None:
    assert verify.needs_glibc("x-1-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl") == (2, 17)
    assert verify.needs_glibc("x-1-cp312-cp312-manylinux_2_34_x86_64.whl") == (2, 34)
    assert verify.needs_glibc("x-1-py3-none-any.whl") is None
    files = [wheels.WheelFile("a-1-cp312-cp312-manylinux_2_39_x86_64.whl", "u", SHA),
             wheels.WheelFile("b-1-py3-none-manylinux_2_28_x86_64.whl", "u", SHA)]
    assert verify.too_new(files, (2, 36)) == ["a-1-cp312-cp312-manylinux_2_39_x86_64.whl"]


STAND_IN = (
    "p.add_argument('--model-path')\n"
    "p.add_argument('--tp-size', '--tensor-parallel-size', type=int)\n"
    "p.add_argument('--moe-runner-backend', choices=['auto', 'flashinfer_cutlass'])"
)


def test_the_flag_argparse_rejects_is_named(tmp_path: Path) -> None:
    def reject(*args: str) -> tuple[str | None, str]:
        cp = parse_with_stand_in(tmp_path, STAND_IN, "--model-path", "/m", *args)
        assert cp.returncode == 2
        return verify.rejected(cp.stderr)

    assert reject("--tp-size", "eight") == (
        "--tp-size", "argument --tp-size/--tensor-parallel-size: invalid int value: 'eight'"
    )  # fmt: skip
    flag, why = reject("--moe-runner-backend", "nope")
    assert flag == "--moe-runner-backend" and why.startswith("argument --moe-runner-backend: invalid choice: 'nope'")
    assert reject("--tp", "8") == ("--tp", "unrecognized arguments: --tp 8")  # no prefix abbreviations
    assert verify.rejected("Traceback ...\nImportError: libcuda.so.1\n") == (None, "ImportError: libcuda.so.1")


@pytest.fixture
def inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> verify.Inputs:
    """A one-wheel lock whose wheel is in a cache of its own; the scratch dir is tmp_path/work."""
    monkeypatch.setenv("STACKBUILD_CACHE_DIR", str(tmp_path / "cache"))
    (cache_dir() / "wheels").mkdir(parents=True)
    (cache_dir() / "wheels" / f"{SHA}.whl").write_bytes(b"x" * 1000)
    (tmp_path / "work").mkdir()
    monkeypatch.setattr(verify.tempfile, "mkdtemp", lambda prefix: str(tmp_path / "work"))
    t = target.Target(PY, "x86_64-manylinux_2_39", ("sglang==0.5.23",), (), target.PYPI, (), None, ())
    text = resolve.header(t, "s", []) + f"sglang==0.5.23 \\\n    --hash=sha256:{SHA}\n"
    return verify.Inputs("s", PY, resolve.parse(text), t, "# verify_image.py\n", "13.0",
                         ["--model-path", "/m", "--tp-size", "8"], "0.5.23")


def _fetch(lock: resolve.Lock, t: target.Target) -> list[wheels.WheelFile]:
    return [wheels.WheelFile("sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl", "u", SHA)]


def _script(work: Path, venv: Path | None = None, **fail: tuple[int, str, str]) -> FakeRun:
    """Every command verify runs, answered as on a good closure unless `fail` says otherwise for a step."""
    vpy = str((venv or work / "venv") / "bin" / "python")
    steps = {
        "install": ([vpy, "-m", "pip", "install"], (0, "", "")),
        "check": ([vpy, "-m", "pip", "check"], (0, "No broken requirements found.\n", "")),
        "versions": ([vpy, str(work / "verify_image.py")],
                     (0, "torch.version.cuda 13.0\nVERIFIED 1/1 locked distributions\n", "")),
        "parser": ([vpy, "-c", verify.PARSER_SCRIPT], (0, "SERVER-ARGS-OK\n", "")),
    }
    fake = FakeRun().on(["/py", "-c", verify.PROBE], 0, f"{PY}.1\n").on(["/py", "-m", "venv"])
    for name, (prefix, answer) in steps.items():
        fake.on(prefix, *fail.get(name, answer))
    return fake


def test_verify_runs_the_steps_in_order_and_cleans_up(inputs: verify.Inputs, tmp_path: Path) -> None:
    work = tmp_path / "work"
    fake = _script(work)
    said: list[str] = []
    report = verify.verify(inputs, python="/py", run=fake, fetch=_fetch, say=said.append)
    vpy = str(work / "venv" / "bin" / "python")
    assert fake.calls == [
        ("/py", "-c", verify.PROBE),
        ("/py", "-m", "venv", "--clear", str(work / "venv")),
        tuple(verify.install_argv(Path(vpy), work / "wheels", work / "requirements.lock")),
        (vpy, "-m", "pip", "check"),
        (vpy, str(work / "verify_image.py"), str(work / "requirements.lock"), "13.0"),
        (vpy, "-c", verify.PARSER_SCRIPT, "--model-path", "/m", "--tp-size", "8"),
    ]
    assert [ln.rsplit(" (", 1)[0] for ln in report.lines] == [
        f"python {PY}.1 at /py",
        "fetched 1 locked wheels into the cache, sha256-checked (0.0 GB)",
        "installed 1 distributions: hash-checked, wheels only, no dependency resolution",
        "pip check: no broken requirements",
        "versions: torch.version.cuda 13.0; VERIFIED 1/1 locked distributions",
        "sglang 0.5.23's own parser accepts the 2 rendered server flags",
    ]
    assert said == report.lines
    assert not work.exists()  # the scratch venv is gone


def test_keep_venv_leaves_it_and_says_where(inputs: verify.Inputs, tmp_path: Path) -> None:
    said: list[str] = []
    verify.verify(inputs, python="/py", keep=True, run=_script(tmp_path / "work"), fetch=_fetch, say=said.append)
    assert said[-1] == f"kept the venv: {tmp_path / 'work' / 'venv'}"
    assert (tmp_path / "work" / "wheels" / "sglang-0.5.23-cp312-cp312-manylinux_2_34_x86_64.whl").resolve() == (
        cache_dir() / "wheels" / f"{SHA}.whl"
    )  # pip reads the cached file under its wheel name


def test_a_named_venv_is_kept_and_reused_for_the_same_lock(inputs: verify.Inputs, tmp_path: Path) -> None:
    venv = tmp_path / "v"
    first = _script(tmp_path / "work", venv)
    said: list[str] = []
    verify.verify(inputs, python="/py", venv=venv, run=first, fetch=_fetch, say=said.append)
    assert ("/py", "-m", "venv", "--clear", str(venv)) in first.calls
    assert said[-1] == f"kept the venv: {venv}"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()  # what `python -m venv` made (the fake made nothing)
    (tmp_path / "work").mkdir()
    again = _script(tmp_path / "work", venv)
    report = verify.verify(inputs, python="/py", venv=venv, run=again, fetch=_fetch)
    assert not [c for c in again.calls if c[1:3] == ("-m", "venv") or c[2:4] == ("pip", "install")]
    assert report.lines[2].startswith(f"reused {venv}: it holds this lock's install")
    assert report.lines[-1].startswith("sglang 0.5.23's own parser accepts")


def test_a_named_venv_that_is_someone_else_s_is_refused(inputs: verify.Inputs, tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(InputError, match="is not empty and not a venv `lock --verify` made; name a new directory"):
        verify.verify(inputs, python="/py", venv=tmp_path / "mine", run=_script(tmp_path / "work"), fetch=_fetch)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


@pytest.mark.parametrize(
    ("step", "answer", "message"),
    [
        ("install", (1, "", "ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE."),
         "installing the lock failed: ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE."),
        ("check", (1, "torch 2.14.1 has requirement triton==3.6.0, but you have triton 3.5.0.\n", ""),
         "pip check: torch 2.14.1 has requirement triton==3.6.0, but you have triton 3.5.0."),
        ("versions", (1, "MISMATCH torch.version.cuda is 12.8, the lock says 13.0\nVERIFIED 1/1\n", ""),
         "versions: torch.version.cuda is 12.8, the lock says 13.0"),
        ("parser", (2, "", "usage: sglang.launch_server [-h]\nsglang.launch_server: error: argument "
                    "--tp-size/--tensor-parallel-size: invalid int value: 'eight'\n"),
         "sglang 0.5.23's parser rejects --tp-size: argument --tp-size/--tensor-parallel-size: invalid int value: "
         "'eight'"),
    ],
)
def test_a_failing_step_says_what_and_keeps_nothing(
    inputs: verify.Inputs, tmp_path: Path, step: str, answer: tuple[int, str, str], message: str
) -> None:
    fake = _script(tmp_path / "work", **{step: answer})
    with pytest.raises(verify.VerifyFailed) as got:
        verify.verify(inputs, python="/py", run=fake, fetch=_fetch)
    assert (str(got.value), got.value.exit_code) == (message, 1)
    assert fake.calls[-1][:3] == {"install": tuple(verify.install_argv(tmp_path / "work/venv/bin/python",
                                                                       Path(), Path()))[:3],
                                  "check": (str(tmp_path / "work/venv/bin/python"), "-m", "pip"),
                                  "versions": (str(tmp_path / "work/venv/bin/python"),
                                               str(tmp_path / "work/verify_image.py"),
                                               str(tmp_path / "work/requirements.lock")),
                                  "parser": (str(tmp_path / "work/venv/bin/python"), "-c", verify.PARSER_SCRIPT)}[step]
    assert not (tmp_path / "work").exists()


def test_verify_refuses_a_stale_lock_before_installing_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = project(tmp_path, {"s.yaml": BASE})
    (root / "stacks" / "s.yaml").write_text(BASE + "lock: {exclude_newer: '2026-12-02T00:00:00Z'}\n")
    rc, err, out = run_cli(capsys, "--root", str(root), "lock", "s", "--verify")
    assert (rc, out) == (2, "")
    assert err == [
        "stackbuild: stacks/s.yaml:4:1: error: stacks/locks/s.txt was resolved for other inputs (components, "
        "python, platform, indexes); run `stackbuild lock s` [lock-stale]"
    ]


@pytest.mark.network
def test_a_small_real_lock_installs_and_verifies(tmp_path: Path) -> None:
    """A real resolution (two pure wheels) fetched from PyPI into the session cache, a real venv of this
    interpreter's version, pip's hash-checked install, pip check and the image's verify_image.py."""
    t = target.Target(PY, "x86_64-manylinux_2_36", ("packaging==24.2", "six==1.17.0"), (), target.PYPI, (),
                      "2026-01-01T00:00:00Z", ())
    text = resolve.header(t, "small", []) + resolve.resolve(t)
    lock = resolve.parse(text)
    inp = verify.Inputs("small", PY, lock, t, (templates_dir() / "verify_image.py").read_text(), "none", [], None)
    said: list[str] = []
    report = verify.verify(inp, python=sys.executable, say=said.append)
    assert [ln.rsplit(" (", 1)[0] for ln in report.lines[2:]] == [
        "installed 2 distributions: hash-checked, wheels only, no dependency resolution",
        "pip check: no broken requirements",
        "versions: VERIFIED 2/2 locked distributions",
        "sglang's parser: not checked (sglang is built from source, not in the lock)",
    ]
    assert said == report.lines


def test_the_cli_hands_verify_the_stacks_own_inputs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """From the committed cuda13 lock: its sglang pin (looked up by the component table's distribution
    name), the CUDA its torch carries, the image's verifier and exactly the unit's server arguments."""
    from stackbuild.render.stack import launch_args
    from stackbuild.spec.load import load_stack

    seen: list[verify.Inputs] = []
    monkeypatch.setattr(verify, "verify", lambda inp, **kw: seen.append(inp))
    root = templates_dir().parent
    rc, err, _ = run_cli(capsys, "--root", str(root), "lock", "cuda13", "--verify")
    assert (rc, err) == (0, [])
    [inp] = seen
    assert (inp.label, inp.sglang, inp.torch_cuda) == ("cuda13", "0.5.23", "13.0")
    assert inp.verify_script == (templates_dir() / "verify_image.py").read_text()
    assert inp.server_args == launch_args(load_stack("cuda13", root=root))
