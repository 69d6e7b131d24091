"""Pure parsing in stackbuild.image.registry."""

from __future__ import annotations

import pytest

from stackbuild.errors import InputError
from stackbuild.image.registry import Ref, base_url, parse_ref, parse_registry

D = "sha256:" + "ab" * 32


def test_parse_ref_tag_and_digest() -> None:
    assert parse_ref("127.0.0.1:5000/stackbuild:sim-0123456789ab") == Ref(
        "127.0.0.1:5000", "stackbuild", "sim-0123456789ab"
    )
    assert parse_ref(f"127.0.0.1:5000/a/b@{D}") == Ref("127.0.0.1:5000", "a/b", None, D)
    assert parse_ref(f"localhost/a:t@{D}").reference == D
    assert str(parse_ref("127.0.0.1:5000/x:stable")) == "127.0.0.1:5000/x:stable"


@pytest.mark.parametrize(
    ("value", "msg"),
    [
        ("stackbuild:sim", "name the registry"),
        ("127.0.0.1:5000/Upper:t", "not a valid"),
        ("127.0.0.1:5000/x", "give a tag or a digest"),
        ("127.0.0.1:5000/x@sha256:zz", "digest must be"),
    ],
)
def test_parse_ref_errors(value: str, msg: str) -> None:
    with pytest.raises(InputError, match=msg):
        parse_ref(value)


def test_parse_registry() -> None:
    assert parse_registry("127.0.0.1:5000/stackbuild") == ("127.0.0.1:5000", "stackbuild")
    for bad in ("127.0.0.1:5000", "stackbuild", "127.0.0.1:5000/Bad"):
        with pytest.raises(InputError, match="expected HOST:PORT/REPO"):
            parse_registry(bad)


def test_base_url_plain_http_only_on_loopback() -> None:
    assert base_url("127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert base_url("localhost:5000") == "http://localhost:5000"
    assert base_url("registry.example.com") == "https://registry.example.com"


def test_a_read_that_meets_a_half_written_tag_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    from stackbuild.effects import http
    from stackbuild.image import registry

    answers = [http.Reply(500, b'{"errors":[{"code":"UNKNOWN"}]}', {}), http.Reply(500, b"", {}),
               http.Reply(200, b"", {"docker-content-digest": "sha256:" + "a" * 64})]
    calls: list[str] = []
    slept: list[float] = []

    def fake(method: str, url: str, **kw: object) -> http.Reply:
        calls.append(method)
        return answers.pop(0)

    monkeypatch.setattr(http, "request", fake)
    monkeypatch.setattr(registry, "sleep", slept.append)
    assert registry.manifest_digest(registry.parse_ref("127.0.0.1:5000/x:t")) == "sha256:" + "a" * 64
    assert calls == ["HEAD", "HEAD", "HEAD"] and slept == [0.5, 1.0]


def test_a_write_is_never_repeated_by_the_read_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    from stackbuild.effects import http
    from stackbuild.image import registry

    calls: list[str] = []

    def fake(method: str, url: str, **kw: object) -> http.Reply:
        calls.append(method)
        return http.Reply(500, b"", {})

    monkeypatch.setattr(http, "request", fake)
    monkeypatch.setattr(registry, "sleep", lambda s: None)
    assert registry._request("PUT", "http://127.0.0.1:5000/v2/x/manifests/t", data=b"{}")[0] == 500
    assert calls == ["PUT"]
