"""The base image pinned for real: `lock` asks the loopback registry what a base's tag names, the lock records
that digest, FROM carries it, and `build` refuses once the tag has moved; a `local/` base is checked against
the daemon's own image. The closure's resolution stands in (PyPI is not what is tested here)."""

from __future__ import annotations

import io
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers_spec import BASE, project, run_cli

from stackbuild.errors import InfraError
from stackbuild.image import engine
from stackbuild.image.build import _local_base, check_locked_base, verify_local_base
from stackbuild.render.stack import render_stack
from stackbuild.spec.load import load_stack
from stackbuild.spec.lock import base, resolve, run
from stackbuild.spec.rules import RULES, check_rules

pytestmark = pytest.mark.integration
REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def pushed_base(docker_client: Any, registry: str, base_image: str) -> Iterator[tuple[str, str, list[str]]]:
    """An image pushed under a fresh tag of a loopback repository: (REF:TAG, its manifest digest, the ids of the
    images made, removed at the end)."""
    ref = f"{registry}/stackbuild-basetest/base:ubuntu24.04-{secrets.token_hex(4)}"
    made: list[str] = []
    try:
        yield ref, _push_as(docker_client, base_image, ref, made), made
    finally:
        for image_id in made:  # the images, their tag and the digest references the pushes left
            docker_client.images.remove(image_id, force=True)


def _push_as(docker_client: Any, base_image: str, ref: str, made: list[str]) -> str:
    """A new image (the local base plus a unique label, so the base itself gains no registry digest) pushed
    as ref: the digest its tag now names."""
    dockerfile = f"FROM {base_image}\nLABEL dev.stackbuild.test.base={secrets.token_hex(4)}\n"
    image, _ = docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), network_mode="none", rm=True)
    made.append(image.id)
    engine.tag(docker_client, image.id, ref)
    return engine.push(docker_client, ref)


def test_lock_pins_the_registrys_digest_from_carries_it_and_build_refuses_a_moved_tag(
        docker_client: Any, base_image: str, pushed_base: tuple[str, str, list[str]], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    ref, digest, made = pushed_base
    monkeypatch.setattr(resolve, "resolve", lambda t, offline=False: "")  # the closure: not what is tested
    monkeypatch.setattr(run, "_natives_online", lambda lock, t: {})
    monkeypatch.setattr(run, "_table", lambda stack, offline: None)
    root = project(tmp_path, {"s.yaml": re.sub(r"base_image: \S+", f"base_image: {ref}", BASE)}, lock=False)

    rc, err, _ = run_cli(capsys, "--root", str(root), "lock", "s")
    assert rc == 0, err
    assert f"base image {ref} is {digest}" in err
    text = (root / "stacks" / "locks" / "s.txt").read_text()
    assert f"# base image: {ref}@{digest}\n" in text
    stack = load_stack("s", root=root)
    assert f"FROM {ref}@{digest} AS base\n" in render_stack(stack).files["Dockerfile"]
    assert check_rules(stack, tuple(r for r in RULES if r.id == "base-image-digest")) == []
    assert run_cli(capsys, "--root", str(root), "lock", "--check", "s")[0] == 0
    notes: list[str] = []
    assert check_locked_base(stack, echo=notes.append) == digest and notes == []

    moved = _push_as(docker_client, base_image, ref, made)
    assert moved != digest
    rc, err, _ = run_cli(capsys, "--root", str(root), "build", "s")
    assert rc == 2 and len(err) == 1, err
    assert err[0].endswith(f"base image {ref} names {moved}, but the lock pins {digest}: run `stackbuild lock s` "
                           f"to take the new base, or keep the locked one with base_image: {ref}@{digest}")
    # a relock takes the tag's new digest
    assert run_cli(capsys, "--root", str(root), "lock", "s")[0] == 0
    assert base.parse((root / "stacks" / "locks" / "s.txt").read_text()) == base.BasePin(ref, moved)


def test_the_sim_base_is_pinned_by_the_daemons_image_id(docker_client: Any, base_image: str) -> None:
    """A `local/` base has no registry digest (`docker import` records none): the build takes its image id
    from the daemon and checks the image it made sits on exactly that base's layers."""
    sim = load_stack("sim", root=REPO_ROOT)
    attrs = _local_base(docker_client, sim)
    assert attrs is not None and attrs["Id"] == docker_client.images.get(base_image).id
    on_base, _ = docker_client.images.build(
        fileobj=io.BytesIO(f"FROM {base_image}\nRUN echo built > /built\n".encode()), network_mode="none", rm=True)
    try:
        verify_local_base(docker_client, on_base.id, attrs)
        with pytest.raises(InfraError, match="is not built on the local base"):
            verify_local_base(docker_client, base_image, {**attrs, "RootFS": {"Layers": ["sha256:" + "0" * 64]}})
    finally:
        docker_client.images.remove(on_base.id, force=True)
