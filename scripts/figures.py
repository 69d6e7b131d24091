"""docs/figures.md, written from what the benches printed: nobody types a figure.

Each bench under bench/ prints its figures and, last, one summary line (`name: key=value ...`).
`run` runs a bench and saves what it printed, with when, where and at which commit, to
bench/results/BENCH[.LABEL].txt (committed); the page is a pure function of those files and
the benches' docstrings, so tests/test_figures.py can hold it current, as `render --check`
does for the Dockerfile.

    python3 scripts/figures.py                        rewrite docs/figures.md from bench/results/
    python3 scripts/figures.py --check                exit 1 when docs/figures.md is not what they give
    python3 scripts/figures.py run BENCH [ARGS ...]   run bench/BENCH.py ARGS, save, rewrite the page
    python3 scripts/figures.py run --label L BENCH [ARGS ...]   saved as BENCH.L.txt (another setting)
    python3 scripts/figures.py run --cheap            the benches that take seconds to a few minutes
                                                      and need no local infrastructure

A figure measured elsewhere and not re-run here (too long, or it needs what this machine lacks) is
saved by hand in the same format with a `note:` saying where it comes from.
"""

from __future__ import annotations

import ast
import datetime
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = Path("docs/figures.md")
RESULTS = Path("bench/results")
# Seconds to a few minutes each, no dockerd, registry or test host needed.
CHEAP = (("cli_latency", ()), ("gate_accuracy", ("--raw",)), ("test_suite", ()))
END = "---"  # ends the header; a bench's own output may start lines with '#'


@dataclass(frozen=True)
class Saved:
    """One saved run of a bench: header fields (command, date, commit, machine, ...) and its output."""

    bench: str
    label: str
    fields: dict[str, str]
    output: list[str]

    @property
    def summary(self) -> str:
        return next((line for line in reversed(self.output) if line.strip()), "")


def parse(name: str, text: str) -> Saved:
    """BENCH[.LABEL].txt: `key: value` lines, a line `---`, then the bench's output verbatim."""
    head, sep, body = text.partition(f"\n{END}\n")
    if not sep:
        raise ValueError(f"{RESULTS / name}: no '{END}' line ends the header")
    fields = {}
    for line in head.splitlines():
        key, colon, value = line.partition(": ")
        if not colon:
            raise ValueError(f"{RESULTS / name}: header line {line!r} is not 'key: value'")
        fields[key] = value
    stem = name.removesuffix(".txt")
    bench, _, label = stem.partition(".")
    return Saved(bench, label, fields, body.splitlines())


def dump(saved: Saved) -> str:
    head = "".join(f"{k}: {v}\n" for k, v in saved.fields.items())
    return f"{head}{END}\n" + "".join(f"{line}\n" for line in saved.output)


def load_all(root: Path) -> list[Saved]:
    saved = [parse(p.name, p.read_text()) for p in (root / RESULTS).glob("*.txt")]
    return sorted(saved, key=lambda s: (s.bench, s.label))  # a bench's plain run first, then its labelled ones


def about(root: Path, bench: str) -> str:
    """The first line of the bench's docstring: what it measures, in its author's words."""
    path = root / "bench" / f"{bench}.py"
    doc = ast.get_docstring(ast.parse(path.read_text())) if path.exists() else None
    return (doc or "(no such bench)").splitlines()[0]


def render(root: Path) -> str:
    saved = load_all(root)
    benches = sorted({p.stem for p in (root / "bench").glob("[!_]*.py")} | {s.bench for s in saved})
    out = [
        "# Measured figures",
        "",
        "Written by `python3 scripts/figures.py` from what the benches under `bench/` printed, saved in",
        "`bench/results/`; do not edit (`tests/test_figures.py` fails when this page is stale). Each",
        "figure says how, when, where and at which commit it was measured. To measure again:",
        "`python3 scripts/figures.py run BENCH [ARGS]`.",
        "",
    ]
    for bench in benches:
        out += [f"## `bench/{bench}.py`", "", about(root, bench), ""]
        runs = [s for s in saved if s.bench == bench]
        if not runs:
            out += [f"Not measured yet: `python3 scripts/figures.py run {bench}`.", ""]
        for s in runs:
            f = s.fields
            if s.label:
                out += [f"### `{s.label}`", ""]
            out += ["```", s.summary, "```", ""]
            run = [f"`{f['command']}`" if "command" in f else "", f.get("date", ""),
                   f"commit {f['commit']}" if "commit" in f else "", f"took {f['took']}" if "took" in f else ""]
            out += [f"- run: {', '.join(filter(None, run))}"]
            if "machine" in f:
                load = f"; load average {f['load']}" if "load" in f else ""
                out += [f"- machine: {f['machine']}{load}"]
            if "note" in f:
                out += [f"- note: {f['note']}"]
            if len(s.output) > 1:
                out += ["", "```", *s.output, "```"]
            out += [""]
    return "\n".join(out).rstrip("\n") + "\n"


def machine() -> str:
    mem = next((int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal:")), 0) if Path("/proc/meminfo").exists() else 0
    return (f"{os.cpu_count()} CPUs, {mem / 2**20:.1f} GiB, {platform.system()} {platform.release()} "
            f"{platform.machine()}, Python {platform.python_version()}")


def commit(root: Path) -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short=12", "HEAD") or "?"
    # the outputs themselves (earlier saved runs, this page) are not what is measured
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", f":!{RESULTS}", f":!{PAGE}")
    return head + (" with uncommitted changes" if changed else "")


def run(root: Path, bench: str, args: list[str], label: str = "") -> Saved:
    """Run bench/BENCH.py with this tree's stackbuild, echo its output as it comes, save it."""
    script = root / "bench" / f"{bench}.py"
    if not script.exists():
        raise SystemExit(f"no bench {script}")
    argv = [sys.executable, str(script.relative_to(root)), *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    load0, t0 = os.getloadavg()[0], time.monotonic()
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines: list[str] = []
    with subprocess.Popen(argv, cwd=root, env=env, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(line, end="", flush=True)
            lines.append(line.rstrip("\n"))
    took, load1 = time.monotonic() - t0, os.getloadavg()[0]
    if proc.returncode != 0:
        raise SystemExit(f"{bench} exited {proc.returncode}; nothing saved")
    fields = {"command": " ".join(["python3", *argv[1:]]), "date": date, "commit": commit(root),
              "took": f"{took:.0f} s", "machine": machine(), "load": f"{load0:.1f} before, {load1:.1f} after"}
    saved = Saved(bench, label, fields, lines)
    name = f"{bench}.{label}.txt" if label else f"{bench}.txt"
    (root / RESULTS).mkdir(parents=True, exist_ok=True)
    (root / RESULTS / name).write_text(dump(saved))
    return saved


def write_page(root: Path) -> bool:
    """Rewrite the page; True when it changed."""
    text, path = render(root), root / PAGE
    if path.exists() and path.read_text() == text:
        return False
    path.write_text(text)
    return True


def main(argv: list[str]) -> int:
    if argv[:1] == ["--check"]:
        if (ROOT / PAGE).read_text() != render(ROOT):
            print(f"{PAGE} is stale: run python3 scripts/figures.py", file=sys.stderr)
            return 1
        return 0
    if argv[:1] == ["run"]:
        rest = argv[1:]
        if rest == ["--cheap"]:
            for bench, args in CHEAP:
                run(ROOT, bench, list(args))
        else:
            label = ""
            if rest[:1] == ["--label"] and len(rest) >= 3:
                label, rest = rest[1], rest[2:]
            if not rest:
                print(__doc__, file=sys.stderr)
                return 2
            run(ROOT, rest[0], rest[1:], label)
    elif argv:
        print(__doc__, file=sys.stderr)
        return 2
    print(f"{PAGE}: {'rewritten' if write_page(ROOT) else 'unchanged'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
