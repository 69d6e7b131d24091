"""The base image pinned by digest: reference parsing, the registry's digest (token flow, with a fake of the
HTTP effect), what the lock records, what FROM carries, what validate says and what build refuses."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers_spec import BASE, project

from stackbuild.effects import http
from stackbuild.errors import InputError
from stackbuild.image import registry
from stackbuild.image.build import _built_on_other_base, check_locked_base
from stackbuild.image.ref import distribution
from stackbuild.render.stack import render_stack
from stackbuild.spec.load import load_stack
from stackbuild.spec.lock import base, check, resolve
from stackbuild.spec.lock.base import BasePin, Unanswered, digest_of, named
from stackbuild.spec.lock.target import lock_path, target_of
from stackbuild.spec.rules import RULES, check_rules

D1 = "sha256:" + "d1" * 32
D2 = "sha256:" + "d2" * 32
TAG = "nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04"
RULE = next(r for r in RULES if r.id == "base-image-digest")
TAG_DIGEST = registry.tag_digest


@pytest.mark.parametrize(("image", "want"), [
    (TAG, ("docker.io", "nvidia/cuda", "13.0.1-cudnn-devel-ubuntu24.04", None)),
    ("debian:bookworm", ("docker.io", "library/debian", "bookworm", None)),
    ("ubuntu", ("docker.io", "library/ubuntu", "latest", None)),
    ("nvcr.io/nvidia/pytorch:25.01-py3", ("nvcr.io", "nvidia/pytorch", "25.01-py3", None)),
    (f"127.0.0.1:5000/a/b:t@{D1}", ("127.0.0.1:5000", "a/b", "t", D1)),
    ("localhost/x", ("localhost", "x", "latest", None)),
    ("local/debian:bookworm", ("docker.io", "local/debian", "bookworm", None)),
])
def test_a_reference_resolves_to_registry_repository_and_tag_as_docker_reads_it(
        image: str, want: tuple[str, str, str, str | None]) -> None:
    assert distribution(image) == want


def test_a_digest_is_read_and_checked() -> None:
    assert digest_of(f"{TAG}@{D1}") == D1 and digest_of(TAG) is None and named(f"{TAG}@{D1}") == TAG
    with pytest.raises(InputError, match="sha256:<64 hex digits>"):
        digest_of(f"{TAG}@sha256:abc")


def test_docker_hub_is_asked_anonymously_through_its_token_realm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STACKBUILD_REGISTRY_USER", "me")
    monkeypatch.setenv("STACKBUILD_REGISTRY_PASSWORD", "secret")  # for the user's registry: never sent here
    calls: list[tuple[str, str, dict[str, str]]] = []
    challenge = ('Bearer realm="https://auth.docker.io/token",service="registry.docker.io",'
                 'scope="repository:nvidia/cuda:pull"')
    answers = [http.Reply(401, b"", {"www-authenticate": challenge}),
               http.Reply(200, b'{"token": "T0K"}', {}),
               http.Reply(200, b"", {"docker-content-digest": D1})]

    def fake(method: str, url: str, **kw: object) -> http.Reply:
        headers = kw.get("headers")
        calls.append((method, url, dict(headers) if isinstance(headers, dict) else {}))
        return answers.pop(0)

    monkeypatch.setattr(http, "request", fake)
    assert registry.tag_digest("docker.io", "nvidia/cuda", "13.0.1-cudnn-devel-ubuntu24.04") == D1
    manifest = "https://registry-1.docker.io/v2/nvidia/cuda/manifests/13.0.1-cudnn-devel-ubuntu24.04"
    assert [(m, u) for m, u, _ in calls] == [
        ("HEAD", manifest),
        ("GET", "https://auth.docker.io/token?scope=repository%3Anvidia%2Fcuda%3Apull&service=registry.docker.io"),
        ("HEAD", manifest)]
    assert "Authorization" not in calls[0][2] and "Authorization" not in calls[1][2]
    assert calls[2][2]["Authorization"] == "Bearer T0K"
    assert calls[0][2]["Accept"] == ", ".join(registry.MANIFEST_TYPES)


def test_a_registry_without_the_tag_says_none_and_one_that_is_not_there_is_unreachable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http, "request", lambda method, url, **kw: http.Reply(404, b"", {}))
    assert registry.tag_digest("127.0.0.1:5000", "x", "t") is None

    def refused(method: str, url: str, **kw: object) -> http.Reply:
        raise http.NoAnswer(method, url, "no such host")

    monkeypatch.setattr(http, "request", refused)
    with pytest.raises(registry.Unreachable):
        registry.tag_digest("docker.io", "library/debian", "bookworm")
    assert registry.challenge('Basic realm="x"') is None


def _resolver(answer: str | Exception | None) -> tuple[base.Resolver, list[str]]:
    asked: list[str] = []

    def base_digest(image: str) -> str | None:
        asked.append(image)
        if isinstance(answer, Exception):
            raise answer
        return answer

    return base_digest, asked


def test_the_registry_adapter_says_why_in_a_phrase_the_lock_can_keep(monkeypatch: pytest.MonkeyPatch) -> None:
    def away(host: str, repo: str, tag: str) -> str | None:
        raise registry.Unreachable("registry https://registry-1.docker.io unreachable (no such host)")

    monkeypatch.setattr(registry, "tag_digest", away)
    with pytest.raises(Unanswered) as err:
        registry.base_digest(TAG)
    assert err.value.why == "its registry docker.io did not answer"
    # a registry that wants credentials (a 401 without a Bearer challenge) names nothing to an anonymous client
    monkeypatch.setattr(registry, "tag_digest", TAG_DIGEST)
    monkeypatch.setattr(http, "request", lambda method, url, **kw: http.Reply(401, b"", {
        "www-authenticate": 'Basic realm="private"'}))
    with pytest.raises(Unanswered) as err:
        registry.base_digest("registry.example.com/team/base:1")
    assert err.value.why == "its registry registry.example.com would not name it to an anonymous client"
    asked: list[tuple[str, str, str]] = []

    def found(host: str, repo: str, tag: str) -> str | None:
        asked.append((host, repo, tag))
        return D1

    monkeypatch.setattr(registry, "tag_digest", found)
    assert registry.base_digest("nvcr.io/nvidia/pytorch:25.01-py3") == D1
    assert asked == [("nvcr.io", "nvidia/pytorch", "25.01-py3")]


def test_lock_pins_what_the_registry_names_and_says_why_when_it_cannot() -> None:
    found, asked = _resolver(D1)
    assert base.resolve(TAG, None, offline=False, tag_digest=found) == (
        BasePin(TAG, D1), f"base image {TAG} is {D1}")
    assert asked == [TAG]
    away, _ = _resolver(Unanswered("its registry docker.io did not answer"))
    assert base.resolve(TAG, None, offline=False, tag_digest=away)[0] == BasePin(
        TAG, None, "its registry docker.io did not answer")
    # the committed pin of the same base is kept where the registry cannot be asked; another base's is not
    assert base.resolve(TAG, BasePin(TAG, D2), offline=False, tag_digest=away)[0] == BasePin(TAG, D2)
    assert base.resolve(TAG, BasePin("other:tag", D2), offline=True, tag_digest=found)[0] == BasePin(
        TAG, None, "locked offline")
    assert asked == [TAG]  # offline: not asked
    # offline, the committed record of the same base stands as it is (so `lock --offline` rewrites nothing)
    assert base.resolve(TAG, BasePin(TAG, None, "its registry docker.io did not answer"), offline=True,
                        tag_digest=found)[0] == BasePin(TAG, None, "its registry docker.io did not answer")
    assert base.resolve(TAG, BasePin(TAG, D2), offline=True, tag_digest=found)[0] == BasePin(TAG, D2)
    spec_pinned, asked = _resolver(D2)
    assert base.resolve(f"{TAG}@{D1}", None, offline=False, tag_digest=spec_pinned)[0] == BasePin(TAG, D1)
    assert base.resolve("local/debian:bookworm", None, offline=False, tag_digest=spec_pinned)[0] == BasePin(
        "local/debian:bookworm", None, "a local image, in no registry")
    assert asked == []  # the spec's own digest, or a local image: no registry to ask
    missing, _ = _resolver(None)
    with pytest.raises(InputError, match=re.escape(f"base_image: its registry has no {TAG}; name a tag that exists")):
        base.resolve(TAG, None, offline=False, tag_digest=missing)


def _tagged(tmp_path: Path, pin: BasePin | None) -> Path:
    """A project whose stack names its base by tag, locked with `pin` as its base line."""
    root = project(tmp_path, {"s.yaml": re.sub(r"base_image: \S+", f"base_image: {TAG}", BASE)}, lock=False)
    stack = load_stack("s", root=root)
    t = target_of(stack)
    assert t is not None
    lock_path(stack).parent.mkdir(parents=True, exist_ok=True)
    lock_path(stack).write_text(resolve.seal(resolve.header(t, "s", [], base=pin)))
    return root


def test_a_locked_digest_is_what_from_carries_and_validate_is_quiet(tmp_path: Path) -> None:
    stack = load_stack("s", root=_tagged(tmp_path, BasePin(TAG, D1)))
    dockerfile = render_stack(stack).files["Dockerfile"]
    assert f"FROM {TAG}@{D1} AS base\n" in dockerfile
    assert f'      org.opencontainers.image.base.digest="{D1}" \\\n' in dockerfile
    assert check_rules(stack, (RULE,)) == []
    assert [f.rule for f in check.current(stack)] == ["lock-date"]  # fresh: only its missing exclude_newer


def test_an_unpinned_lock_leaves_the_tag_and_validate_says_how_to_pin_it(tmp_path: Path) -> None:
    stack = load_stack("s", root=_tagged(tmp_path, BasePin(TAG, None, "its registry docker.io did not answer")))
    dockerfile = render_stack(stack).files["Dockerfile"]
    assert f"FROM {TAG} AS base\n" in dockerfile and "image.base.digest" not in dockerfile
    [finding] = check_rules(stack, (RULE,))
    assert finding.severity == "warning" and finding.message.startswith(
        f"base_image '{TAG}' is unpinned (its registry docker.io did not answer):")
    assert "run `stackbuild lock s` where its registry answers" in finding.message
    assert f"`base_image: {TAG}@sha256:DIGEST`" in finding.message


def test_a_hand_edited_base_digest_and_a_lock_for_another_base_are_stale(tmp_path: Path) -> None:
    root = _tagged(tmp_path, BasePin(TAG, D1))
    stack = load_stack("s", root=root)
    p = lock_path(stack)
    p.write_text(p.read_text().replace(D1, D2))
    [edited] = check.current(load_stack("s", root=root))
    assert edited.rule == "lock-stale" and "was edited after it was resolved" in edited.message
    p.write_text(resolve.seal(resolve.header(target_of(stack), "s", [], base=BasePin("nvidia/cuda:13.0.2", D1))))  # type: ignore[arg-type]
    [other] = check.current(load_stack("s", root=root))
    assert other.message == (f"stacks/locks/s.txt was made for base image nvidia/cuda:13.0.2@{D1}, the spec names "
                             f"{TAG}; run `stackbuild lock s`")
    assert (other.line, other.rule) == (1, "lock-stale")


def test_build_refuses_a_base_whose_tag_moved_since_the_lock(tmp_path: Path) -> None:
    stack = load_stack("s", root=_tagged(tmp_path, BasePin(TAG, D1)))
    notes: list[str] = []
    asked: list[tuple[str, str, str]] = []

    def names(digest: str) -> Callable[[str, str, str], str | None]:
        def tag_digest(host: str, repo: str, tag: str) -> str | None:
            asked.append((host, repo, tag))
            return digest
        return tag_digest

    assert check_locked_base(stack, echo=notes.append, tag_digest=names(D1)) == D1 and notes == []
    assert asked == [("docker.io", "nvidia/cuda", "13.0.1-cudnn-devel-ubuntu24.04")]
    with pytest.raises(InputError) as err:
        check_locked_base(stack, echo=notes.append, tag_digest=names(D2))
    assert str(err.value) == (
        f"{stack.source}:1:13: base image {TAG} names {D2}, but the lock pins {D1}: run `stackbuild lock s` to take "
        f"the new base, or keep the locked one with base_image: {TAG}@{D1}")
    def away(host: str, repo: str, tag: str) -> str | None:
        raise registry.Unreachable("registry https://registry-1.docker.io unreachable (no such host)")

    assert check_locked_base(stack, echo=notes.append, tag_digest=away) == D1
    assert notes == [f"note: cannot check that {TAG} still names the locked {D1} (registry "
                     "https://registry-1.docker.io unreachable (no such host)); building the locked digest"]


def test_a_local_base_image_is_rebuilt_on_when_the_daemon_has_another() -> None:
    now = {"Id": "sha256:" + "b" * 64, "RepoTags": ["local/debian:bookworm"]}
    built = {"Config": {"Labels": {"dev.stackbuild.base.id": "sha256:" + "a" * 64}}}
    assert _built_on_other_base(built, now) == (
        f"rebuilding: the image was built on local base sha256:{'a' * 64}, the daemon's is now sha256:{'b' * 64}")
    assert _built_on_other_base({"Config": {"Labels": {"dev.stackbuild.base.id": now["Id"]}}}, now) is None
    assert _built_on_other_base(built, None) is None and _built_on_other_base(None, now) is None


def test_validate_offline_warns_about_the_shipped_base_from_the_committed_lock_alone(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from helpers_spec import run_cli

    from stackbuild.paths import shipped_dir

    def no_network(method: str, url: str, **kw: object) -> http.Reply:
        raise AssertionError(f"validate --offline asked {url}")

    monkeypatch.setattr(http, "request", no_network)
    rc, err, _ = run_cli(capsys, "--root", str(shipped_dir("stacks").parent), "validate", "cuda13", "--offline")
    [warning] = [ln for ln in err if ln.endswith("[base-image-digest]")]
    assert rc == 0 and warning.startswith(
        f"stacks/cuda13.yaml:11:1: warning: base_image '{TAG}' is unpinned (its registry docker.io did not answer)")
