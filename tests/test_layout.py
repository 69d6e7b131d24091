"""The package's shape holds: folders are the pipeline, imports only point down it, no cycles.

Layers, lowest first: the core (errors, paths, effects), spec, render, image, gate, results,
host, fleet, sim, cli. A module may import its own layer or a lower one; the import graph
(lazy imports inside functions included, they are dependencies all the same) has no cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

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


def _layer(mod: str) -> int:
    parts = mod.split(".")
    if len(parts) > 1 and parts[1] == "__main__":
        return len(LAYERS)
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else -1


def _edges() -> dict[str, set[str]]:
    mods = _modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        for n in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
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
