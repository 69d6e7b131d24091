"""Real builds: the sim stack through BuildKit, smoke test, registry push, promote, pull by digest,
secrets kept out of the image, and bad input ending in one line with exit 2/4 and no half tag."""

from __future__ import annotations

import io
import json
import os
import secrets
import tarfile
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from stackbuild.cli.main import main
from stackbuild.image import buildkit, engine
from stackbuild.image.build import BuildResult, _secret_files, build_stack
from stackbuild.image.registry import manifest_digest, parse_ref, promote
from stackbuild.spec.load import load_stack

pytestmark = pytest.mark.integration
REPO_ROOT = Path(__file__).resolve().parents[1]
TEST_REPO = "stackbuild-buildtest"


def _root_with(tmp: Path, name: str, old: str = "", new: str = "") -> Path:
    """A project root holding one stack: the shipped sim spec with `old` replaced by `new`."""
    (tmp / "stacks").mkdir(parents=True, exist_ok=True)
    text = (REPO_ROOT / "stacks" / "sim.yaml").read_text()
    assert old in text
    (tmp / "stacks" / f"{name}.yaml").write_text(text.replace(old, new, 1))
    return tmp


@pytest.fixture(scope="session")
def sim_built(docker_client: Any, registry: str, base_image: str) -> BuildResult:
    stack = load_stack("sim", root=REPO_ROOT)
    built = build_stack(stack, registry=f"{registry}/{TEST_REPO}", push=True)
    if built.skipped and engine.image_attrs(docker_client, built.image) is None:
        docker_client.images.pull(built.image)  # a registry that already had it skips the build
    return built


def test_sim_image_is_tagged_labelled_and_pushed(docker_client: Any, sim_built: BuildResult, registry: str) -> None:
    assert sim_built.image.startswith(f"{registry}/{TEST_REPO}:sim-")
    assert sim_built.tag == f"sim-{sim_built.hash[:12]}"
    labels = engine.labels_of(docker_client.images.get(sim_built.image).attrs)
    assert labels["dev.stackbuild.hash"] == sim_built.hash
    assert labels["dev.stackbuild.stack"] == "sim"
    assert labels["org.opencontainers.image.title"] == "stackbuild sim"
    assert labels["org.opencontainers.image.base.name"] == "local/debian:bookworm"
    assert json.loads(labels["dev.stackbuild.lock"])["stack"] == "sim"
    assert sim_built.digest and sim_built.digest.startswith("sha256:")
    assert manifest_digest(parse_ref(sim_built.image)) == sim_built.digest
    # No temporary tag survives the build.
    tags = _all_tags(docker_client)
    assert not [t for t in tags if "-partial" in t and TEST_REPO in t]


def test_render_and_build_dry_run_name_the_tag_the_build_makes(
    sim_built: BuildResult, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One hash, one tag: the unit `render` writes, `build --dry-run` and the real build agree."""
    reg = sim_built.image.rsplit(":", 1)[0]
    assert main(["render", "sim", "--out", str(tmp_path / "out")]) == 0
    unit = (tmp_path / "out" / "units" / "stackbuild-sim.service").read_text()
    assert f"127.0.0.1:5000/stackbuild:{sim_built.tag} " in unit
    capsys.readouterr()
    assert main(["build", "sim", "--dry-run", "--registry", reg]) == 0
    dry = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("image: ")]
    assert dry == [f"image: {sim_built.image}"]


def test_second_build_is_skipped_with_same_digest(sim_built: BuildResult, registry: str) -> None:
    lines: list[str] = []
    again = build_stack("sim", root=REPO_ROOT, registry=f"{registry}/{TEST_REPO}", push=True, echo=lines.append)
    assert again.skipped and again.image == sim_built.image and again.digest == sim_built.digest
    assert any(ln.startswith("skipped: ") for ln in lines)


def test_promote_channel_then_pull_back_by_digest(docker_client: Any, sim_built: BuildResult) -> None:
    assert sim_built.repo_digest
    digest = promote(sim_built.repo_digest, "stable")
    assert digest == sim_built.digest
    channel = parse_ref(sim_built.image.rsplit(":", 1)[0] + ":stable")
    assert manifest_digest(channel) == sim_built.digest
    # Pull by digest after dropping the local tag: the registry really serves it.
    engine.untag(docker_client, sim_built.image)
    try:
        image_id = engine.pull(docker_client, sim_built.repo_digest)
        assert image_id == sim_built.image_id
    finally:
        docker_client.images.get(sim_built.repo_digest).tag(*sim_built.image.rsplit(":", 1))


def test_promote_cli_prints_channel_and_digest(sim_built: BuildResult, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["promote", sim_built.image, "--channel", "canary"]) == 0
    assert capsys.readouterr().out.strip().endswith(f":canary -> {sim_built.digest}")


def test_build_cli_records_the_build_once_in_the_ledger(
    sim_built: BuildResult, registry: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from stackbuild.image.context import rendered_for_image
    from stackbuild.results.ledger import Ledger

    db = tmp_path / "ledger.db"
    argv = ["build", "sim", "--push", "--registry", f"{registry}/{TEST_REPO}", "--ledger", str(db)]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert out.strip() == sim_built.repo_digest  # found in the registry, not rebuilt
    assert f"ledger: recorded the build of {sim_built.image} in {db}" in err
    assert main(argv) == 0  # the same image again: not a second row
    with Ledger(db) as ledger:
        (b,) = ledger.builds()
    assert (b.stack, b.variant, b.image, b.digest, b.content_hash) == (
        "sim", None, sim_built.image, sim_built.digest, sim_built.hash)
    assert b.lock == rendered_for_image(load_stack("sim", root=REPO_ROOT)).lock == sim_built.lock
    assert b.lock["content_hash"] == sim_built.hash
    report = (tmp_path / "report.md").read_text()
    assert f"| sim | `{sim_built.image}` | `{sim_built.digest}` | not deployed |" in report


def test_dry_run_prints_command_and_context(sim_built: BuildResult, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["build", "sim", "--dry-run", "--registry", sim_built.image.split(":sim-")[0]]) == 0
    err = capsys.readouterr().err
    assert "builder: " in err and ("BuildKit" in err or "buildx" in err)
    assert f"image: {sim_built.image}" in err  # dry run and real build agree on the hash
    assert "command: DOCKER_BUILDKIT=1 " in err and " --network host " in err
    assert "wheelhouse/app/stackbuild-" in err


def _image_bytes(c: Any, ref: str) -> bytes:
    """Every byte of the image: layers, config (history, labels), manifest."""
    return b"".join(c.images.get(ref).save(named=True))


def test_build_secret_never_lands_in_the_image(docker_client: Any, base_image: str, tmp_path: Path) -> None:
    planted = "hf_" + secrets.token_hex(16)
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(
        f"FROM {base_image}\n"
        "RUN --mount=type=secret,id=hf_token,required=true "
        "sha256sum /run/secrets/hf_token | cut -c1-64 > /token.sha256 && ls -la /run/secrets > /mounts.txt\n"
        'LABEL dev.stackbuild.note="secret test"\n'
    )
    stack = load_stack(_root_with(tmp_path / "root", "sec") / "stacks" / "sec.yaml")
    os.environ["HF_TOKEN"] = planted
    try:
        files = _secret_files(stack, tmp_path / "secrets")
    finally:
        del os.environ["HF_TOKEN"]
    assert set(files) == {"hf_token"} and (files["hf_token"].stat().st_mode & 0o777) == 0o600
    ref = f"stackbuild-secrettest:{secrets.token_hex(4)}"
    b = buildkit.find_builder()
    req = buildkit.BuildRequest(context=ctx, tag=ref, secrets=files, no_cache=True)
    buildkit.stream_build(buildkit.build_argv(b, req), env=b.env(os.environ), log_path=tmp_path / "log", timeout=300)
    try:
        out = docker_client.containers.run(ref, ["cat", "/token.sha256"], network_mode="none", remove=True)
        import hashlib

        assert out.decode().strip() == hashlib.sha256(planted.encode()).hexdigest()  # the build did see it
        blob = _image_bytes(docker_client, ref)
        assert planted.encode() not in blob
        with tarfile.open(fileobj=io.BytesIO(blob)) as outer:
            for m in outer.getmembers():
                f = outer.extractfile(m) if m.isreg() else None
                if f is None:
                    continue
                data = f.read()
                assert planted.encode() not in data, m.name
                if m.name.endswith(".tar"):
                    with tarfile.open(fileobj=io.BytesIO(data)) as layer:
                        for lm in layer.getmembers():
                            lf = layer.extractfile(lm) if lm.isreg() else None
                            assert lf is None or planted.encode() not in lf.read(), lm.name
        history = json.dumps(docker_client.api.history(ref))
        assert planted not in history and planted not in json.dumps(docker_client.images.get(ref).attrs)
        assert planted not in (tmp_path / "log").read_text()
    finally:
        docker_client.images.remove(ref, force=True)


def _no_tags_for(c: Any, label: str) -> list[str]:
    return [t for t in _all_tags(c) if f":{label}-" in t]


def _all_tags(c: Any) -> list[str]:
    # one listing call: images.list() inspects each image after listing, and other test
    # workers remove their own images in between
    return [t for img in c.api.images() for t in (img.get("RepoTags") or [])]


def test_failing_run_step_exit_4_names_the_log_and_leaves_no_tag(
    docker_client: Any, base_image: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _root_with(
        tmp_path, "badapt", "  secrets: [hf_token]\n", "  secrets: [hf_token]\n  apt: [no-such-package-sb]\n"
    )
    rc = main(["--root", str(root), "build", "badapt"])
    err = capsys.readouterr().err
    assert rc == 4
    assert (
        "stackbuild: build failed at [base 2/2] (exit code 100): E: Unable to locate package no-such-package-sb\n"
        in err
    )
    assert "Traceback" not in err
    log = next(ln.split("full log: ", 1)[1] for ln in err.splitlines() if "full log: " in ln)
    assert "Unable to locate package no-such-package-sb" in Path(log).read_text()
    assert _no_tags_for(docker_client, "badapt") == []


def test_failing_smoke_test_names_the_flag_and_leaves_no_tag(
    docker_client: Any, base_image: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _root_with(tmp_path, "badflag", "    --warmup-s: 1\n", "    --warmup-s: 1\n    --no-such-sim-flag: 3\n")
    rc = main(["--root", str(root), "build", "badflag"])
    err = capsys.readouterr().err
    assert rc == 4, err
    assert "smoke test of " in err and "does not accept --no-such-sim-flag" in err
    assert "Traceback" not in err
    assert _no_tags_for(docker_client, "badflag") == []


def test_bad_inputs_end_in_one_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert main(["build", "no-such-stack"]) == 2
    assert "no stack named 'no-such-stack'" in capsys.readouterr().err
    assert main(["build", "sim", "--push", "--registry", "127.0.0.1:1/x"]) == 4
    assert capsys.readouterr().err.strip() == (
        "stackbuild: registry http://127.0.0.1:1 unreachable ([Errno 111] Connection refused); is it running?"
    )
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    assert main(["build", "sim"]) == 4
    err = capsys.readouterr().err.strip()
    assert err.startswith("stackbuild: Docker daemon not reachable at unix:///nonexistent/docker.sock")
    assert len(err.splitlines()) == 1


def test_registry_pull_goes_to_loopback_only(registry: str) -> None:
    with urllib.request.urlopen(f"http://{registry}/v2/_catalog", timeout=5) as r:
        assert TEST_REPO in json.load(r)["repositories"]
