"""The package index over effects/http (its one owner): a wheel listed, fetched, checked, on a
local HTTP server that stands in for the index."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from stackbuild.effects import http
from stackbuild.errors import InfraError
from stackbuild.spec.lock import wheels

WHEEL = b"PK not really a wheel, but bytes with a hash" * 50_000  # > one 1 MiB chunk
SHA = hashlib.sha256(WHEEL).hexdigest()


class _Index(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/simple/demo/":
            body = json.dumps({"files": [
                {"filename": "demo-1.0-py3-none-any.whl", "url": "../../files/demo.whl", "hashes": {"sha256": SHA}},
                {"filename": "demo-1.0.tar.gz", "url": "../../files/demo.tar.gz", "hashes": {}},
            ]}).encode()
        elif self.path == "/files/demo.whl":
            body = WHEEL
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def index() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    # a short poll: shutdown() waits for serve_forever's next poll, 0.5 s by default, once per test
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def test_the_index_lists_hashed_files_and_a_wheel_lands_checked(index: str) -> None:
    files = wheels.index_files(index + "/simple", "demo")
    assert files == [wheels.WheelFile("demo-1.0-py3-none-any.whl", index + "/files/demo.whl", SHA)]
    got = wheels.fetch(files[0])
    assert got.read_bytes() == WHEEL and got.name == f"{SHA}.whl"


def test_a_wheel_whose_bytes_are_not_the_locked_ones_never_lands(index: str) -> None:
    bad = wheels.WheelFile("demo-1.0-py3-none-any.whl", index + "/files/demo.whl", "0" * 64)
    with pytest.raises(InfraError, match="is not the locked"):
        wheels.fetch(bad)
    assert not (wheels.cache_root() / f"{'0' * 64}.whl").exists()
    assert list(wheels.cache_root().glob("*.part")) == []


def test_what_the_index_does_not_have_is_one_line(index: str) -> None:
    with pytest.raises(InfraError, match=r"cannot list nothing on .*: GET .*/simple/nothing/: HTTP 404"):
        wheels.index_files(index + "/simple", "nothing")
    with pytest.raises(InfraError, match=r"downloading x\.whl: GET .*/files/x\.whl: HTTP 404"):
        wheels.fetch(wheels.WheelFile("x.whl", index + "/files/x.whl", "1" * 64))


def test_download_streams_in_chunks_and_names_a_silent_port(index: str, tmp_path: Path) -> None:
    chunks: list[bytes] = []
    http.download(index + "/files/demo.whl", chunks.append)
    assert b"".join(chunks) == WHEEL and len(chunks) > 1
    with pytest.raises(http.NoAnswer):
        http.download("http://127.0.0.1:9/x", chunks.append, timeout=5)
