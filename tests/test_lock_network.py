"""The resolver and the audit against the real package index (marked `network`; CI runs them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stackbuild.spec.lock import audit, resolve, target, wheels

pytestmark = pytest.mark.network

# torch-memory-saver 0.0.9 (sglang 0.5.10.post1's pin): a 0.5 MB native wheel that links the CUDA runtime.
SMALL = target.Target(
    python="3.12",
    platform="x86_64-manylinux_2_39",
    requirements=("torch-memory-saver==0.0.9",),
    source_built=(),
    index_url=target.PYPI,
    extra_index_urls=(),
    exclude_newer="2026-04-09T23:59:59Z",
    constraints=(),
)


@pytest.fixture(scope="module")
def small_lock() -> resolve.Lock:
    return resolve.parse(resolve.header(SMALL, "t", []) + resolve.resolve(SMALL))


def test_uv_resolves_a_hash_pinned_lock_with_its_index(small_lock: resolve.Lock) -> None:
    lock = small_lock
    e = lock.entries["torch-memory-saver"]
    assert (e.version, e.index, lock.inputs_hash) == ("0.0.9", "https://pypi.org/simple", SMALL.inputs_hash())
    assert len(e.hashes) >= 1 and all(len(h) == 64 for h in e.hashes)
    # the same inputs give the same file (no temp paths): the lock's digest is in the image's content hash
    assert resolve.resolve(SMALL) == lock.text.split("\n", 5)[5]


def test_a_real_native_wheel_is_fetched_by_sha256_and_audited(
    small_lock: resolve.Lock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STACKBUILD_CACHE_DIR", str(tmp_path))
    w = wheels.locate(small_lock.entries["torch-memory-saver"], SMALL)
    assert w.name == "torch_memory_saver-0.0.9-cp39-abi3-manylinux2014_x86_64.whl" and w.native
    a = audit.audit_cached(w.sha256, w.name, lambda: wheels.fetch(w))
    assert (a.cuda_links, a.sass, a.ptx) == ({"libcudart.so.12": 12}, [], [])
    assert wheels.cached(w.sha256) == tmp_path / "wheels" / f"{w.sha256}.whl"
    assert audit.cached_audit(w.sha256) == a  # the second look needs neither the index nor the wheel


def test_yesterdays_cuda128_stack_resolves_to_cuda13_and_says_so(tmp_path: Path) -> None:
    """sglang 0.5.23 on a CUDA 12.8.1 base: the real resolution holds CUDA 13 packages; each is an error
    located at the component that pulled it in, naming the 580 driver it needs."""
    from helpers_spec import project

    from stackbuild.spec.load import load_stack
    from stackbuild.spec.lock import check

    spec = (
        "base_image: nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04\n"
        'cuda: "12.8.1"\n'
        "arches: [sm_120]\n"
        'python: "3.12"\n'
        "components:\n"
        "  torch: {version: 2.14.1}\n"
        "  sgl_kernel: {version: 0.4.10}\n"
        "  flashinfer: {version: 0.7.2}\n"
        "  sglang: {version: 0.5.23}\n"
        "server: {model_path: /models/m}\n"
        "lock: {exclude_newer: '2026-11-01T00:00:00Z'}\n"
    )
    root = project(tmp_path, {"old.yaml": spec}, lock=False)
    stack = load_stack("old", root=root)
    t = target.target_of(stack)
    assert t is not None
    found = [str(f) for f in check.cuda_packages(stack, resolve.parse(resolve.resolve(t)))]
    runtime = [f for f in found if "nvidia-cuda-runtime==13." in f]
    assert len(runtime) == 1 and runtime[0].endswith(
        "(pulled in by sglang) is a CUDA 13 package, which needs driver >= 580; "
        "this stack is CUDA 12.8.1 (driver >= 570) [lock-cuda-major]"
    )
    assert runtime[0].split(": error: ")[0].endswith("stacks/old.yaml:9:3")  # components.sglang
    assert any("cuda-python==13." in f for f in found) and any("nvidia-nccl-cu13" in f for f in found)


def test_a_python_the_release_has_no_wheels_for_is_located_at_python(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from helpers_spec import BASE, project, run_cli

    text = BASE.replace(', index: "https://download.pytorch.org/whl/cu130"', "") + 'python: "3.10"\n'
    root = project(tmp_path, {"s.yaml": text}, lock=False)
    rc, err, _ = run_cli(capsys, "--root", str(root), "lock", "s")
    assert rc == 2
    assert err[1].startswith("stacks/s.yaml:18:1: error: no resolution: Because sglang==0.5.23 has no wheels")
    assert err[1].endswith(
        "(v0.5.23) with the following Python implementation tags: `cp311`, `cp312`, `cp313` [lock-unsatisfiable]"
    )
    assert not (root / "stacks" / "locks").exists()


def _pinned(name: str, version: str, t: target.Target) -> wheels.WheelFile:
    files = [f for f in wheels.index_files(target.PYPI, name) if f"-{version}-" in f.name]
    got = wheels.choose(files, t)
    assert got is not None
    return got


def test_fatbin_reading_agrees_with_nvidia_cuobjdump(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torchaudio 2.11.0 (1.7 MB, in the cuda13 closure) read by our parser and by cuobjdump 13.5 (PyPI)."""
    import re
    import subprocess
    import zipfile

    from stackbuild.spec.lock.elf import read_elf_path

    monkeypatch.setenv("STACKBUILD_CACHE_DIR", str(tmp_path / "cache"))
    t = SMALL
    tool = wheels.fetch(_pinned("nvidia-cuda-cuobjdump", "13.5.37", t))
    with zipfile.ZipFile(tool) as z:
        cuobjdump = Path(z.extract("nvidia/cu13/bin/cuobjdump", tmp_path))
    cuobjdump.chmod(0o755)
    wheel = wheels.fetch(_pinned("torchaudio", "2.11.0", t))
    ours: tuple[set[int], set[int]] = (set(), set())
    theirs: tuple[set[int], set[int]] = (set(), set())
    with zipfile.ZipFile(wheel) as z:
        for n in (n for n in z.namelist() if re.search(r"\.so(\.\d+)*$", n)):
            so = tmp_path / "x.so"
            so.write_bytes(z.read(n))
            facts = read_elf_path(so)
            assert facts is not None
            ours[0].update(facts.gpu.sass)
            ours[1].update(facts.gpu.ptx)
            for flag, dest in (("--list-elf", theirs[0]), ("--list-ptx", theirs[1])):
                out = subprocess.run([str(cuobjdump), flag, str(so)], capture_output=True, text=True).stdout
                dest.update(int(a) for a in re.findall(r"sm_(\d+)", out))
    assert theirs[0] and ours == theirs


def test_the_aot_driver_fits_the_real_flashinfer_wheel() -> None:
    """templates/flashinfer_aot.py relies on flashinfer-python 0.7.2's own code: read it from the wheel (65 MB)."""
    import importlib.util
    import re
    import zipfile

    spec = importlib.util.spec_from_file_location(
        "fi_aot", Path(__file__).parents[1] / "templates" / "flashinfer_aot.py"
    )
    assert spec is not None and spec.loader is not None
    driver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(driver)
    with zipfile.ZipFile(wheels.fetch(_pinned("flashinfer-python", "0.7.2", SMALL))) as z:
        names = set(z.namelist())
        aot = z.read("flashinfer/aot.py").decode()
        env = z.read("flashinfer/jit/env.py").decode()
    assert re.search(
        r"def compile_and_package_modules\(\s*out_dir[^,]*,\s*build_dir[^,]*,\s*project_root[^,]*,\s*config[^,]*,"
        r"\s*verbose[^,]*,\s*skip_prebuilt",
        aot,
    )
    # every tree it reads from project_root is one the driver links, to a tree the wheel ships
    read = {"/".join(p) for p in re.findall(r'project_root / "(\w+)"(?: / "(\w+)")?', aot)}
    read = {r.rstrip("/") for r in read}
    assert read and read <= set(driver.LAYOUT)
    for tree in driver.LAYOUT.values():
        assert any(n.startswith(f"flashinfer/data/{tree}/") for n in names), tree
    assert 'out_dir / jit_spec.name / f"{jit_spec.name}.so"' in aot
    # and the runtime loads NAME/NAME.so from <package>/data/aot first
    assert 'FLASHINFER_AOT_DIR: pathlib.Path = _package_root / "data" / "aot"' in env
    assert 'fallback_path = FLASHINFER_AOT_DIR / module_name / f"{module_name}.so"' in env
    assert 'FLASHINFER_DATA: pathlib.Path = _package_root / "data"' in env


SHIPPED_ROOT = Path(__file__).parents[1]


@pytest.mark.parametrize("name", ["cuda13", "cuda12.8"])
def test_a_relock_reproduces_the_committed_lock_line_for_line(name: str) -> None:
    """Resolved as of its lock.exclude_newer against today's index: the committed file, to the byte."""
    from stackbuild.spec.load import load_stack
    from stackbuild.spec.lock import check

    stack = load_stack(name, root=SHIPPED_ROOT)
    t = target.target_of(stack)
    lock = check.read_lock(stack)
    assert t is not None and t.exclude_newer and lock is not None
    committed_body = resolve.body_of(lock.text)  # past the header's comment lines, however many
    assert resolve.resolve(t).splitlines() == committed_body.splitlines()


@pytest.mark.parametrize("version", ["0.5.23", "0.5.10.post1"])
def test_the_committed_flag_tables_are_what_the_wheels_say(version: str) -> None:
    """stacks/locks/sglang-VERSION.flags.json, regenerated from the real wheel (into the session cache)."""
    from stackbuild.spec import sglang

    committed = (SHIPPED_ROOT / "stacks" / "locks" / sglang.table_name(version)).read_text()
    assert sglang.table_of_wheel(version).to_json() + "\n" == committed


def test_a_stack_building_torch_from_source_locks_and_renders(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The closure and the build tools resolved for real against PyPI: torch's build wants setuptools 75.6.0
    while sglang 0.5.23's closure pins a later one, so the two resolve apart (each hash-pinned). The source
    ref's commit stands in (git hosts are not reachable from CI), and so does the audit's download of every
    native wheel (GBs; test_a_real_native_wheel_is_fetched_by_sha256_and_audited does a real one)."""
    from helpers_spec import BASE, project, run_cli, source_component

    from stackbuild.render.stack import render_stack
    from stackbuild.spec.load import load_stack
    from stackbuild.spec.lock import run, source

    monkeypatch.setattr(source, "resolve_ref", lambda repo, ref: "2" * 40)
    monkeypatch.setattr(run, "_natives_online", lambda lock, t: {})
    torch_src = source_component("torch", "2.14.1", "https://github.com/pytorch/pytorch.git", "v2.14.1",
                                 'env: {USE_CUDA: "1"}')
    text = BASE.replace('  torch: {version: 2.14.1, index: "https://download.pytorch.org/whl/cu130"}\n', torch_src)
    text += "lock: {exclude_newer: '2026-12-02T00:00:00Z'}\n"
    root = project(tmp_path, {"s.yaml": text}, lock=False)
    rc, err, _ = run_cli(capsys, "--root", str(root), "lock", "s")
    assert rc == 0, err
    closure = resolve.parse((root / "stacks" / "locks" / "s.txt").read_text())
    tools = resolve.parse((root / "stacks" / "locks" / "s.build-tools.txt").read_text())
    assert "torch" not in closure.entries and closure.edited() is None and tools.edited() is None
    assert tools.entries["setuptools"].version == "75.6.0"
    assert closure.entries["setuptools"].version != "75.6.0"  # why they cannot be one resolution
    assert all(e.hashes for e in tools.entries.values())
    assert run_cli(capsys, "--root", str(root), "lock", "--check", "s")[:2] == (0, [])
    rendered = render_stack(load_stack("s", root=root))
    assert "FROM deps AS torch" in rendered.files["Dockerfile"]
    assert rendered.files["build-tools.lock"] == (root / "stacks" / "locks" / "s.build-tools.txt").read_text()
