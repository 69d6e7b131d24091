"""Fuzz: random and mutated YAML never produce a traceback, only exit 0 or clean exit-2 lines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from helpers_fuzz import examples
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from stackbuild.cli.main import main
from stackbuild.paths import shipped_dir

SHIPPED = {p.name: p.read_text() for p in sorted(shipped_dir("stacks").glob("*.yaml"))}
LINE = re.compile(r"^(\S+:\d+:\d+: (error|warning): .+ \[[a-z0-9-]+\]|stackbuild: .+)$")

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False),
    st.text(max_size=12),
    st.sampled_from(["sm_120", "13.0.1", "--tp-size", "all", "baseline"]),
)
keys = st.one_of(
    st.sampled_from(
        [
            "server",
            "flags",
            "runtime",
            "components",
            "torch",
            "variants",
            "extends",
            "patches",
            "gate",
            "profiles",
            "env",
            "cuda",
            "arches",
            "port",
            "gpus",
            "tp",
        ]
    ),
    st.text(min_size=1, max_size=8),
)
trees = st.recursive(
    scalars, lambda ch: st.one_of(st.lists(ch, max_size=4), st.dictionaries(keys, ch, max_size=5)), max_leaves=25
)


def _mutate(text: str, ops: list[tuple[int, int, str]]) -> str:
    lines = text.splitlines()
    for kind, at, junk in ops:
        if not lines:
            break
        i = at % len(lines)
        if kind == 0:
            del lines[i]
        elif kind == 1:
            lines.insert(i, lines[i])
        elif kind == 2:
            lines[i] = lines[i][: len(lines[i]) // 2] + junk
        elif kind == 3:
            lines[i] = "  " + lines[i]
        else:
            lines[i] = lines[i].replace(":", junk, 1)
    return "\n".join(lines) + "\n"


def _run(tmp: Path, files: dict[str, str], capsys: pytest.CaptureFixture[str], only: str | None = None) -> None:
    stacks = tmp / "stacks"
    stacks.mkdir(parents=True, exist_ok=True)
    for f in stacks.glob("*.yaml"):
        f.unlink()
    for name, text in files.items():
        (stacks / name).write_text(text)
    (stacks / "patches").mkdir(exist_ok=True)
    src = shipped_dir("stacks") / "patches"
    for p in src.glob("*.patch"):
        (stacks / "patches" / p.name).write_text(p.read_text())
    rc = main(["--root", str(tmp), "validate", "--offline", *[str(stacks / n) for n in files if only in (None, n)]])
    _, err = capsys.readouterr()
    assert rc in (0, 2), err
    for ln in err.splitlines():
        assert LINE.match(ln), ln


FUZZ = settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(tree=trees)
@example(tree={"bool": None})  # an unknown key named like a union member pydantic reports ('bool', 'str', ...)
def test_random_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str], tree: object) -> None:
    _run(tmp_path, {"f.yaml": yaml.safe_dump(tree)}, capsys)


@FUZZ
@given(
    name=st.sampled_from(sorted(SHIPPED)),
    ops=st.lists(
        st.tuples(
            st.integers(0, 4),
            st.integers(0, 200),
            st.sampled_from(["", "]", "{", ": :", "\t", "&a", "*b", "'", "- x", "@"]),
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_mutated_shipped_specs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, ops: list[tuple[int, int, str]]
) -> None:
    files = dict(SHIPPED)
    files[name] = _mutate(SHIPPED[name], ops)
    # the others are there for `extends`; validating them unchanged every example would only cost time
    _run(tmp_path, files, capsys, only=name)


@FUZZ
@given(text=st.text(max_size=200))
def test_arbitrary_text(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> None:
    _run(tmp_path, {"t.yaml": text}, capsys)
