"""The package's shape holds: folders are the pipeline, imports only point down it, no cycles.

Layers, lowest first: the core (errors, paths, effects), spec, render, image, gate, results,
host, fleet, sim, cli. A module may import its own layer or a lower one; the import graph
(lazy imports inside functions included, they are dependencies all the same) has no cycle.
A folder's `_private` names stay inside it, and only effects/ starts processes.
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "stackbuild"
LAYERS = ["effects", "spec", "render", "image", "gate", "results", "host", "fleet", "sim", "cli"]
MAX_LINES = 450


def _modules() -> dict[str, Path]:
    out = {}
    for f in PKG.rglob("*.py"):
        parts = f.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = f
    return out


@functools.cache
def _tree(f: Path) -> ast.Module:
    return ast.parse(f.read_text(encoding="utf-8"))


def _folder(mod: str) -> str:
    """stackbuild.X.Y... -> X; a top-level module (errors, paths) is a folder of its own."""
    return mod.split(".")[1] if mod.count(".") > 0 else mod


def _layer(mod: str) -> int:
    parts = mod.split(".")
    if len(parts) > 1 and parts[1] == "__main__":
        return len(LAYERS)
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else -1


def _edges() -> dict[str, set[str]]:
    mods = _modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        for n in ast.walk(_tree(f)):
            names: list[str] = []
            if isinstance(n, ast.Import):
                names = [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
                names = [n.module, *(f"{n.module}.{a.name}" for a in n.names)]
            edges[m] |= {t for t in names if t in mods and t != m}
    return edges


def test_every_module_sits_in_a_layer_folder() -> None:
    loose = sorted(m for m in _modules() if _layer(m) == -1 and m.count(".") > 0
                   and m.split(".")[1] not in {"errors", "paths"})
    assert loose == []


def test_no_import_points_up_the_pipeline() -> None:
    up = sorted(f"{m} -> {t}" for m, ts in _edges().items() for t in ts if _layer(t) > _layer(m))
    assert up == []


def test_no_import_cycles() -> None:
    edges = _edges()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(edges[m]):
            if state.get(t) == 1:
                cycles.append([*path[path.index(t):], t] if t in path else [m, t])
            elif t not in state:
                visit(t, [*path, t])
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])
    assert cycles == []


def test_modules_stay_readable_in_one_sitting() -> None:
    long = sorted(f"{m}: {n}" for m, f in _modules().items() if (n := len(f.read_text().splitlines())) > MAX_LINES)
    assert long == []


# Imports of another folder's private names that exist today; each one is to go, and this list with it.
PRIVATE_ALLOWED: set[str] = set()


def _private_uses() -> set[str]:
    """`from pkg.mod import _name` and `mod._name` (mod an imported module) across folders."""
    mods = _modules()
    out = set()
    for m, f in mods.items():
        tree = _tree(f)
        aliases: dict[str, str] = {}
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
                for a in n.names:
                    if f"{n.module}.{a.name}" in mods:
                        aliases[a.asname or a.name] = f"{n.module}.{a.name}"
                    elif n.module in mods and a.name.startswith("_") and not a.name.startswith("__"):
                        out.add((m, n.module, a.name))
            elif isinstance(n, ast.Import):
                aliases.update({a.asname: a.name for a in n.names if a.asname and a.name in mods})
        for n in ast.walk(tree):
            if (isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in aliases
                    and n.attr.startswith("_") and not n.attr.startswith("__")):
                out.add((m, aliases[n.value.id], n.attr))
    return {f"{m} -> {t}.{name}" for m, t, name in out if _folder(m) != _folder(t)}


def test_no_folder_imports_another_folders_private_names() -> None:
    found = _private_uses()
    assert found - PRIVATE_ALLOWED == set(), "make the name public in its own module, or move the caller"
    assert PRIVATE_ALLOWED - found == set(), "gone: remove it from PRIVATE_ALLOWED"


def test_private_name_check_sees_both_spellings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "stackbuild"
    for rel, text in {
        "__init__.py": "",
        "results/__init__.py": "",
        "results/ledger.py": "def _now() -> None: ...\n",
        "results/report.py": "from stackbuild.results.ledger import _now\n",  # its own folder: fine
        "fleet/__init__.py": "",
        "fleet/a.py": "from stackbuild.results.ledger import _now\n",
        "fleet/b.py": "from stackbuild.results import ledger as lg\nlg._now()\nlg.__name__\n",
    }.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "PKG", pkg)
    assert _private_uses() == {
        "stackbuild.fleet.a -> stackbuild.results.ledger._now",
        "stackbuild.fleet.b -> stackbuild.results.ledger._now",
    }


def test_only_effects_starts_processes() -> None:
    """subprocess is imported by effects/ alone (proc runs every child, long-running ones included)."""
    found = []
    for m, f in _modules().items():
        for n in ast.walk(_tree(f)):
            names = [a.name for a in n.names] if isinstance(n, ast.Import) else []
            names += [n.module] if isinstance(n, ast.ImportFrom) and n.module else []
            if any(x == "subprocess" or x.startswith("subprocess.") for x in names) and _folder(m) != "effects":
                found.append(f"{m}:{n.lineno}")
    assert found == []
