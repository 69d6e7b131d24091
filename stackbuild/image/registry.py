"""The registry's HTTP v2 API: does a tag exist, what digest, promote a channel tag.

Promotion re-puts the very manifest bytes under the channel tag, so the channel
points at the same digest and no layer moves. Loopback registries speak plain
HTTP (as docker allows); others HTTPS. Basic auth comes from the environment
(STACKBUILD_REGISTRY_USER / STACKBUILD_REGISTRY_PASSWORD), never from a spec.
"""

from __future__ import annotations

import base64
import json
import os
import re
import urllib.parse
from dataclasses import dataclass
from time import sleep

from stackbuild.effects import http
from stackbuild.errors import InfraError, InputError
from stackbuild.image.ref import distribution
from stackbuild.spec.lock.base import Unanswered

MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
_HOST_RE = re.compile(r"^(?:[A-Za-z0-9.-]+|\[[0-9a-fA-F:]+\])(?::\d{1,5})?$")
_REPO_RE = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*$")
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
READ_TRIES = 3
READ_BACKOFF_S = 0.5
# Where a registry's v2 API answers, when that is not the name images carry (docker's own mapping).
API_HOSTS = {"docker.io": "registry-1.docker.io"}
_CHALLENGE_RE = re.compile(r'(\w+)="([^"]*)"')


class Unreachable(InfraError):
    """The registry did not answer at all (no route, no name, refused, timed out)."""


class NoDigest(InfraError):
    """The registry answered, but would not name the tag's digest (credentials wanted, a bad answer)."""


@dataclass(frozen=True)
class Ref:
    host: str
    repo: str
    tag: str | None = None
    digest: str | None = None

    @property
    def reference(self) -> str:
        ref = self.digest or self.tag
        assert ref
        return ref

    @property
    def name(self) -> str:
        return f"{self.host}/{self.repo}"

    def __str__(self) -> str:
        return f"{self.name}@{self.digest}" if self.digest else f"{self.name}:{self.tag}"


def parse_registry(value: str) -> tuple[str, str]:
    """`HOST:PORT/REPO` -> (host, repo); InputError naming the expected shape."""
    host, sep, repo = value.partition("/")
    if not sep or not _looks_like_host(host) or not _REPO_RE.match(repo):
        raise InputError(f"--registry {value!r}: expected HOST:PORT/REPO, e.g. 127.0.0.1:5000/stackbuild")
    return host, repo


def parse_ref(value: str) -> Ref:
    """`HOST[:PORT]/REPO:TAG` or `HOST[:PORT]/REPO@sha256:...` (pure)."""
    rest, _, digest = value.partition("@")
    host, sep, path = rest.partition("/")
    if not sep or not _looks_like_host(host):
        raise InputError(f"image {value!r}: name the registry, e.g. 127.0.0.1:5000/stackbuild:sim-0123abcd4567")
    tag = None
    last = path.rsplit("/", 1)[-1]
    if ":" in last:
        path, tag = path.rsplit(":", 1)
    if not _REPO_RE.match(path) or (tag is not None and not _TAG_RE.match(tag)):
        raise InputError(f"image {value!r}: not a valid HOST:PORT/REPO:TAG reference")
    if digest and not _DIGEST_RE.match(digest):
        raise InputError(f"image {value!r}: digest must be sha256:<64 hex>")
    if not tag and not digest:
        raise InputError(f"image {value!r}: give a tag or a digest (REPO:TAG or REPO@sha256:...)")
    return Ref(host, path, tag, digest or None)


def _looks_like_host(host: str) -> bool:
    return bool(_HOST_RE.match(host)) and ("." in host or ":" in host or host == "localhost")


def base_url(host: str) -> str:
    name = host.rsplit(":", 1)[0] if not host.startswith("[") else host
    loopback = name == "localhost" or name.startswith("127.") or name == "[::1]"
    return f"{'http' if loopback else 'https'}://{host}"


def _request(
    method: str, url: str, *, headers: dict[str, str] | None = None, data: bytes | None = None, timeout: float = 30,
    anonymous: bool = False,
) -> tuple[int, dict[str, str], bytes]:
    """anonymous: never send the environment's credentials (they are for the user's registry, not a base's)."""
    hdrs = dict(headers or {})
    user, pw = os.environ.get("STACKBUILD_REGISTRY_USER"), os.environ.get("STACKBUILD_REGISTRY_PASSWORD")
    if user and pw and not anonymous and "Authorization" not in hdrs:
        hdrs["Authorization"] = "Basic " + base64.b64encode(f"{user}:{pw}".encode()).decode()
    # A read may race a push of the same tag: the registry's filesystem storage then answers
    # 500 ("invalid checksum digest format") for the instant the tag's link is half written.
    tries = READ_TRIES if method in ("GET", "HEAD") else 1
    for attempt in range(tries):
        try:
            reply = http.request(method, url, body=data, headers=hdrs, timeout=timeout)
        except http.NoAnswer as err:
            raise Unreachable(f"registry {url.split('/v2/')[0]} unreachable ({err.reason}); is it running?") from None
        if reply.status < 500 or attempt + 1 == tries:
            break
        sleep(READ_BACKOFF_S * 2**attempt)
    return reply.status, reply.headers, reply.body


def ping(host: str) -> None:
    status, _, body = _request("GET", f"{base_url(host)}/v2/", timeout=10)
    if status == 401:
        raise InfraError(f"registry {host} wants credentials: set STACKBUILD_REGISTRY_USER/PASSWORD")
    if status != 200:
        raise InfraError(f"registry {host} answered {status} on /v2/: {body[:200]!r}")


def manifest_digest(ref: Ref) -> str | None:
    """The manifest digest the registry has for ref, or None if it has no such tag."""
    url = f"{base_url(ref.host)}/v2/{ref.repo}/manifests/{ref.reference}"
    status, headers, _body = _request("HEAD", url, headers={"Accept": ", ".join(MANIFEST_TYPES)})
    if status == 404:
        return None
    if status != 200:
        raise InfraError(f"registry: HEAD {url} answered {status}")
    return headers.get("docker-content-digest")


def tag_digest(host: str, repo: str, tag: str, *, timeout: float = 10) -> str | None:
    """The manifest digest `host/repo:tag` names now (an index's for a multi-platform image), or None when the
    registry has no such tag. A registry that answers 401 with a Bearer challenge (Docker Hub, nvcr.io) gets an
    anonymous pull token from the realm it names first (the distribution token protocol); Unreachable when
    nothing answers. Always anonymous: the environment's credentials are for the user's own registry."""
    api = API_HOSTS.get(host, host)
    url = f"{base_url(api)}/v2/{repo}/manifests/{tag}"
    accept = {"Accept": ", ".join(MANIFEST_TYPES)}
    status, headers, _ = _request("HEAD", url, headers=accept, timeout=timeout, anonymous=True)
    if status == 401 and (token := _anonymous_token(headers.get("www-authenticate", ""), repo, timeout)):
        status, headers, _ = _request("HEAD", url, headers={**accept, "Authorization": f"Bearer {token}"},
                                      timeout=timeout, anonymous=True)
    if status == 404:
        return None
    if status in (401, 403):
        raise NoDigest(f"registry {host} does not name {repo}:{tag} to an anonymous client")
    digest = headers.get("docker-content-digest", "")
    if status != 200 or not _DIGEST_RE.match(digest):
        raise NoDigest(f"registry: HEAD {url} answered {status} without a sha256 Docker-Content-Digest")
    return digest


def base_digest(image: str) -> str | None:
    """What `lock` asks about a base image (NAME:TAG, as docker resolves the name): the digest its tag names
    now, None when the registry has no such tag; base.Unanswered, with the phrase the lock records, when the
    registry cannot be asked."""
    host, repo, tag, _ = distribution(image)
    try:
        return tag_digest(host, repo, tag)
    except Unreachable:
        raise Unanswered(f"its registry {host} did not answer") from None
    except NoDigest:
        raise Unanswered(f"its registry {host} would not name it to an anonymous client") from None


def challenge(header: str) -> dict[str, str] | None:
    """`Bearer realm="...",service="...",scope="..."` -> its parameters; None for any other scheme (pure)."""
    scheme, _, params = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return {k.lower(): v for k, v in _CHALLENGE_RE.findall(params)}


def _anonymous_token(header: str, repo: str, timeout: float) -> str | None:
    params = challenge(header)
    realm = (params or {}).get("realm", "")
    if not params or not realm.startswith(("https://", "http://")):
        return None
    query = {"scope": params.get("scope") or f"repository:{repo}:pull"}
    if params.get("service"):
        query["service"] = params["service"]
    url = f"{realm}{'&' if '?' in realm else '?'}{urllib.parse.urlencode(query)}"
    status, _, body = _request("GET", url, timeout=timeout, anonymous=True)
    if status != 200:
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    token = doc.get("token") or doc.get("access_token") if isinstance(doc, dict) else None
    return token if isinstance(token, str) and token else None


def promote(image: str, channel: str, registry: str | None = None) -> str:
    """Point REPO:CHANNEL at the manifest of `image`; returns the digest both now name."""
    if not _TAG_RE.match(channel):
        raise InputError(f"--channel {channel!r}: a tag name ([A-Za-z0-9_.-], at most 128 characters)")
    if registry and "/" not in image.split("@")[0].split(":")[0]:
        image = f"{registry}{'' if image.startswith(('@', ':')) else ':'}{image}"
    ref = parse_ref(image)
    src = f"{base_url(ref.host)}/v2/{ref.repo}/manifests/{ref.reference}"
    status, headers, body = _request("GET", src, headers={"Accept": ", ".join(MANIFEST_TYPES)})
    if status == 404:
        raise InputError(f"{ref}: no such image in the registry; build and push it first (stackbuild build --push)")
    if status != 200:
        raise InfraError(f"registry: GET {src} answered {status}: {body[:200]!r}")
    digest = headers.get("docker-content-digest", "")
    if ref.digest and digest and digest != ref.digest:
        raise InfraError(f"registry returned digest {digest} for {ref}; refusing to promote")
    ctype = headers.get("content-type", MANIFEST_TYPES[-1])
    dst = f"{base_url(ref.host)}/v2/{ref.repo}/manifests/{channel}"
    status, headers, body = _request("PUT", dst, headers={"Content-Type": ctype}, data=body)
    if status not in (200, 201):
        raise InfraError(f"registry: PUT {dst} answered {status}: {body[:200]!r}")
    now = manifest_digest(Ref(ref.host, ref.repo, channel))
    if digest and now != digest:
        raise InfraError(f"registry: {ref.name}:{channel} now names {now}, expected {digest}")
    return now or digest
