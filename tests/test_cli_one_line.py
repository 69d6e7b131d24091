"""Issue 10, item 8: each of these ends in one located line and exit 2 — no traceback, bounded cost."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from stackbuild.cli.main import main
from stackbuild.results.ledger import Ledger

LINE = re.compile(r"^(\S+:\d+:\d+: error: .+ \[[a-z0-9-]+\]|stackbuild: .+)$")


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str], needle: str) -> None:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert lines and all(LINE.match(ln) for ln in lines), err
    assert needle in lines[0], err


def _spec(tmp_path: Path, body: bytes) -> list[str]:
    (tmp_path / "stacks").mkdir(exist_ok=True)
    f = tmp_path / "stacks" / "s.yaml"
    f.write_bytes(body)
    return ["--root", str(tmp_path), "validate", "--offline", str(f)]


def test_non_utf8_spec_is_located(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = _spec(tmp_path, b'name: x\ndescription: "\xff\xfe"\n')
    _one_line(capsys, argv, "s.yaml:2:15: error: byte 0xff is not UTF-8")


def test_alias_bomb_is_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 9^12 leaves if expanded; refused after MAX_NODES, in well under a second
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 12)]
    _one_line(capsys, _spec(tmp_path, ("\n".join(lines) + "\n").encode()), "YAML expands to more than 20000 values")


def test_deep_nesting_is_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # located at the first node past the limit: "a" is depth 1, so the 51st bracket (column 4 + 50)
    _one_line(capsys, _spec(tmp_path, b"a: " + b"[" * 3000 + b"]" * 3000 + b"\n"),
              "s.yaml:1:54: error: YAML nested deeper than 50 levels")
    _one_line(capsys, _spec(tmp_path, b"a: " + b"[" * 60 + b"]" * 60 + b"\n"), "s.yaml:1:54: error: YAML nested deeper")
    main(_spec(tmp_path, b"a: " + b"[" * 50 + b"]" * 50 + b"\n"))  # at the limit: other errors, not this one
    assert "nested deeper" not in capsys.readouterr().err


def test_huge_file_is_refused_unread(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _one_line(capsys, _spec(tmp_path, b"description: " + b"x" * (2 << 20) + b"\n"), "larger than 1 MiB")


def test_render_out_unwritable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "f").write_text("")
    _one_line(capsys, ["render", "sim", "--offline", "--out", str(tmp_path / "f" / "x")], "--out ")
    assert (tmp_path / "f").read_text() == ""


def test_report_out_unwritable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    Ledger(tmp_path / "l.db").close()
    (tmp_path / "f").write_text("")
    _one_line(capsys, ["report", "--ledger", str(tmp_path / "l.db"), "--out", str(tmp_path / "f" / "r.md")], "--out ")


def test_known_hosts_not_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kh = tmp_path / "kh"
    kh.write_bytes(bytes(range(256)) * 8)
    _one_line(capsys, ["status", "--host", "127.0.0.1:1", "--known-hosts", str(kh), "--service", "x"],
              "--known-hosts ")
