"""`validate`: each server.expect_log line is printed where its source says, in the release the stack runs.

An expectation is only as good as its citation: a line no release prints would fail every start
(`present`) or prove nothing (`absent`). Each source names "sglang VERSION PATH:LINE[-LINE]"; the
check reads that file from the release's real wheel (stackbuild.spec.sglang's cache) and looks for
the line's opening words near the cited lines, where logger calls spell them (split string literals,
f-strings: so only the opening words, up to the first formatted value, are looked for).
"""

from __future__ import annotations

import re
import zipfile
from functools import lru_cache
from pathlib import Path

from stackbuild.errors import Finding
from stackbuild.spec import sglang
from stackbuild.spec.load import positions
from stackbuild.spec.stack import LogLine, Stack

OPENING = 20  # characters of the line looked for in the source
SLACK = 3  # source lines either side of the cited range
_SOURCE = re.compile(r"(?P<dist>\S+) (?P<version>\S+) (?P<path>\S+):(?P<first>\d+)(?:-(?P<last>\d+))?")


@lru_cache(maxsize=64)
def _source(wheel: Path, mtime_ns: int, size: int, path: str) -> tuple[str, ...] | None:
    """The lines of sglang/PATH in the wheel, None where it has no such file; cached by the wheel's
    identity (path, mtime, size): opening its zip costs ~70 ms, and a stack cites a few files."""
    try:
        with zipfile.ZipFile(wheel) as z:
            return tuple(z.read(f"sglang/{path}").decode("utf-8", "replace").splitlines())
    except KeyError:
        return None


def _cited_lines(wheel: Path, path: str, first: int, last: int) -> list[str] | None:
    st = wheel.stat()
    lines = _source(wheel, st.st_mtime_ns, st.st_size, path)
    return None if lines is None else list(lines[max(0, first - 1 - SLACK): last + SLACK])


def line_problem(line: LogLine, wheel: Path) -> str | None:
    """Why `line` is not printed where its source says (pure but for reading the wheel), or None."""
    m = _SOURCE.fullmatch(line.source)
    assert m is not None  # the kind (SourceLine) checked the shape at load
    first = int(m["first"])
    last = int(m["last"] or first)
    cited = _cited_lines(wheel, m["path"], first, last)
    if cited is None:
        return f"{line.source}: sglang {m['version']} has no file {m['path']}; cite the file that prints the line"
    opening = line.text[:OPENING]
    if not any(opening in src for src in cited):
        return (f"{line.source} does not print {opening!r} (not within {SLACK} lines of the cited ones); "
                "cite the line that prints it")
    return None


def check_expect_log(stack: Stack, *, offline: bool) -> list[Finding]:
    expect = stack.server.expect_log
    if not expect:
        return []
    loc = positions(stack)
    out: list[Finding] = []
    listed = [("present", i, ln) for i, ln in enumerate(expect.present)]
    listed += [("absent", i, ln) for i, ln in enumerate(expect.absent)]
    unchecked: set[str] = set()
    for kind, i, ln in listed:
        path = ("server", "expect_log", kind, i, "source")
        pos = loc.pos(path)
        m = _SOURCE.fullmatch(ln.source)
        assert m is not None
        where = f"server.expect_log.{kind}.{i}.source"
        if m["dist"] != "sglang":
            out.append(Finding(pos.file, pos.line, pos.col, "error",
                               f"{where}: cite sglang's source (the server, or the simulator standing in for it), "
                               f"not {m['dist']}", "expect-log-source"))
            continue
        if stack.server.engine == "sglang" and m["version"] != stack.sglang_version:
            out.append(Finding(pos.file, pos.line, pos.col, "error",
                               f"{where}: cites sglang {m['version']} but the stack runs sglang "
                               f"{stack.sglang_version}; cite the line in the release it runs", "expect-log-source"))
            continue
        wheel = sglang.wheel_path(m["version"])
        if wheel is None and not offline and stack.server.engine == "sglang":
            wheel = sglang.ensure_wheel(m["version"], offline=False)
        if wheel is None:
            unchecked.add(m["version"])
            continue
        if why := line_problem(ln, wheel):
            out.append(Finding(pos.file, pos.line, pos.col, "error", f"{where}: {why}", "expect-log-source"))
    if unchecked and stack.server.engine == "sglang":
        pos = loc.keys.get(("server", "expect_log")) or loc.pos(("server", "expect_log"))
        out.append(Finding(pos.file, pos.line, pos.col, "warning",
                           f"server.expect_log: sources not checked offline: sglang {', '.join(sorted(unchecked))} is "
                           f"not in the cache; run `stackbuild validate {stack.name}` once online to fetch it",
                           "expect-log-unchecked"))
    return out
