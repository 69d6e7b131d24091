"""docs/figures.md is what scripts/figures.py makes from the benches' saved outputs: nobody types a figure."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _figures() -> ModuleType:
    spec = importlib.util.spec_from_file_location("figures", ROOT / "scripts" / "figures.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["figures"] = mod  # dataclasses resolve their module by name
    spec.loader.exec_module(mod)
    return mod


figures = _figures()


def test_the_page_is_current() -> None:
    page = (ROOT / "docs" / "figures.md").read_text()
    assert page == figures.render(ROOT), "docs/figures.md is stale: run python3 scripts/figures.py"


def test_every_saved_output_parses_and_ends_with_its_summary_line() -> None:
    saved = figures.load_all(ROOT)
    assert saved, "bench/results/ holds no saved output"
    for s in saved:
        assert (ROOT / "bench" / f"{s.bench}.py").exists(), f"bench/results/{s.bench}*: no bench/{s.bench}.py"
        assert "=" in s.summary and ":" in s.summary, f"{s.bench}: last line {s.summary!r} is no summary line"
        assert {"command", "date", "commit"} <= s.fields.keys(), f"{s.bench}: says not how, when or at which commit"


def _project(tmp_path: Path, bench_body: str) -> Path:
    (tmp_path / "bench").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "bench" / "tiny.py").write_text(f'"""How tiny things are.\n\nMore."""\n{bench_body}')
    (tmp_path / "bench" / "unrun.py").write_text('"""Never run yet."""\n')
    (tmp_path / "bench" / "_shared.py").write_text('"""What benches share: no bench itself."""\n')
    return tmp_path


def test_a_saved_run_becomes_its_section(tmp_path: Path) -> None:
    root = _project(tmp_path, "")
    (root / "bench" / "results").mkdir()
    (root / "bench" / "results" / "tiny.txt").write_text(
        "command: python3 bench/tiny.py\ndate: 2026-12-05 10:00 UTC\ncommit: abc\ntook: 3 s\n"
        "machine: 2 CPUs\nload: 1.0 before, 2.0 after\n---\n# a table line\ntiny: size_s=1.5\n")
    (root / "bench" / "results" / "tiny.old.txt").write_text(
        "command: python3 bench/tiny.py --old\ndate: 2026-01-01\ncommit: def\nnote: transcribed\n---\ntiny: size_s=9\n")
    text = figures.render(root)
    assert text.split("\n## ")[1:] == [
        "`bench/tiny.py`\n\nHow tiny things are.\n\n"
        "```\ntiny: size_s=1.5\n```\n\n"
        "- run: `python3 bench/tiny.py`, 2026-12-05 10:00 UTC, commit abc, took 3 s\n"
        "- machine: 2 CPUs; load average 1.0 before, 2.0 after\n\n"
        "```\n# a table line\ntiny: size_s=1.5\n```\n\n"
        "### `old`\n\n```\ntiny: size_s=9\n```\n\n"
        "- run: `python3 bench/tiny.py --old`, 2026-01-01, commit def\n- note: transcribed\n",
        "`bench/unrun.py`\n\nNever run yet.\n\nNot measured yet: `python3 scripts/figures.py run unrun`.\n",
    ]


def test_run_saves_what_the_bench_printed_and_the_page_follows(tmp_path: Path) -> None:
    root = _project(tmp_path, "import sys\nprint('# ' + ' '.join(sys.argv[1:]))\nprint('tiny: size_s=2')\n")
    saved = figures.run(root, "tiny", ["--fast"], label="fast")
    assert saved.output == ["# --fast", "tiny: size_s=2"] and saved.summary == "tiny: size_s=2"
    again = figures.parse("tiny.fast.txt", (root / "bench" / "results" / "tiny.fast.txt").read_text())
    assert again == saved and saved.fields["command"] == "python3 bench/tiny.py --fast"
    assert figures.write_page(root) is True and figures.write_page(root) is False  # written once, then current
    assert "tiny: size_s=2" in (root / "docs" / "figures.md").read_text()


def test_a_failing_bench_saves_nothing(tmp_path: Path) -> None:
    root = _project(tmp_path, "raise SystemExit(3)\n")
    with pytest.raises(SystemExit, match="tiny exited 3; nothing saved"):
        figures.run(root, "tiny", [])
    assert not (root / "bench" / "results").exists()


def test_a_header_without_its_end_is_refused() -> None:
    with pytest.raises(ValueError, match="no '---' line ends the header"):
        figures.parse("x.txt", "command: x\ntiny: size_s=1\n")
