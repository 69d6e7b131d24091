"""The package's shape holds: folders are the pipeline, imports only point down it, no cycles.

Layers, lowest first: the core (errors, paths, effects), spec, render, image, gate, results,
host, fleet, sim, flows, cli, testing. A module may import its own layer or a lower one; the import graph
(lazy imports inside functions included, they are dependencies all the same) has no cycle.
A folder's `_private` names stay inside it, and only effects/ starts processes.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "stackbuild"
LAYERS = ["effects", "spec", "render", "image", "gate", "results", "host", "fleet", "sim", "flows", "cli", "testing"]
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


MAX_FUNCTION_LINES = 80
# function -> why it may stay over MAX_FUNCTION_LINES; none today (an entry that is gone or short fails the test)
LONG_FUNCTIONS_ALLOWED: dict[str, str] = {}


def _function_lengths() -> dict[str, int]:
    """Every function and method of the package (nested ones too) by qualified name -> its lines,
    `def` to its last line (end_lineno - lineno + 1; decorators not counted)."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for n in ast.iter_child_nodes(node):
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}.{n.name}"
                if not isinstance(n, ast.ClassDef):
                    out[name] = (n.end_lineno or n.lineno) - n.lineno + 1
                visit(n, name)
            else:
                visit(n, prefix)

    for m, f in _modules().items():
        visit(_tree(f), m)
    return out


def test_functions_stay_readable_in_one_screen() -> None:
    lengths = _function_lengths()
    long = sorted(f"{name}: {n}" for name, n in lengths.items()
                  if n > MAX_FUNCTION_LINES and name not in LONG_FUNCTIONS_ALLOWED)
    assert long == [], f"split into named steps (at most {MAX_FUNCTION_LINES} lines each)"
    stale = sorted(name for name in LONG_FUNCTIONS_ALLOWED if lengths.get(name, 0) <= MAX_FUNCTION_LINES)
    assert stale == [], "gone or short now: remove it from LONG_FUNCTIONS_ALLOWED"


def test_function_lengths_are_counted_by_qualified_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "stackbuild"
    (pkg / "host").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "host" / "__init__.py").write_text("")
    body = "".join(f"    x{i} = {i}\n" for i in range(3))
    (pkg / "host" / "deploy.py").write_text(
        f"@decorated\ndef flow():\n{body}    def step():\n        pass\n\n\n"
        f"class Rollout:\n    async def wave(self):\n{body.replace('    ', '        ')}")
    monkeypatch.setattr(sys.modules[__name__], "PKG", pkg)
    assert _function_lengths() == {"stackbuild.host.deploy.flow": 6, "stackbuild.host.deploy.flow.step": 2,
                                   "stackbuild.host.deploy.Rollout.wave": 4}


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


# --------------------------------------------------------------------------- owners and fakes

ROOT = PKG.parent
# Beside the package, what else ships code a user runs (the benches and scripts measure and regenerate).
TOOLS = ("bench", "scripts")


def _is_fake(mod: str) -> bool:
    return mod.startswith("stackbuild.testing.") or mod == "stackbuild.testing" or "fake" in mod.rsplit(".", 1)[-1]


def _imports(f: Path) -> set[str]:
    out: set[str] = set()
    for n in ast.walk(_tree(f)):
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
            out |= {n.module, *(f"{n.module}.{a.name}" for a in n.names)}
    return out


def test_only_fakes_and_tests_import_a_fake() -> None:
    """Production code never imports a fake (the fakes are for tests: stackbuild/testing/)."""
    mods = _modules()
    users = {m: f for m, f in mods.items() if not _is_fake(m)}
    users |= {str(f.relative_to(ROOT)): f for d in TOOLS for f in (ROOT / d).rglob("*.py")}
    found = sorted(f"{m} -> {t}" for m, f in users.items() for t in _imports(f) if t in mods and _is_fake(t))
    assert found == []


def test_only_effects_opens_urls() -> None:
    """HTTP has one owner (effects/http.py): no urlopen in the package outside effects/, nor in scripts/."""
    files = {m: f for m, f in _modules().items() if _folder(m) != "effects"}
    files |= {str(f.relative_to(ROOT)): f for f in (ROOT / "scripts").rglob("*.py")}
    found = sorted(f"{m}:{n.lineno}" for m, f in files.items() for n in ast.walk(_tree(f))
                   if (isinstance(n, ast.Attribute) and n.attr == "urlopen")
                   or (isinstance(n, ast.Name) and n.id == "urlopen")
                   or (isinstance(n, ast.ImportFrom) and any(a.name == "urlopen" for a in n.names)))
    assert found == []


# Public names defined at the top of modules in two or more packages, each with why it may stay.
# Each is a twin a reader can confuse; the list is to shrink, never to grow without a reason.
TWINS_ALLOWED: dict[str, str] = {
    "DOCKER": "host/local (the test host's CLI) and render/stack (the unit's ExecStart): the same path, "
              "two owners; one constant in effects/ is to come",
    "ENV_DIR": "host/secrets and render/stack: the same /etc/stackbuild, read by the unit and written by "
               "the deploy; to be one constant",
    "Entry": "spec/components (a component table row) vs spec/lock/resolve (a locked distribution)",
    "Gateway": "effects/gateway (the worker API protocol) vs spec/gateway (the spec's gateway section)",
    "HostRow": "fleet/rollout's row and the structural Protocol results/recorder writes from (no upward import)",
    "Recorder": "results/recorder's class and the Protocol fleet/rollout records through (no upward import)",
    "Report": "results/report (the results table) vs spec/lock/verify (a verify run's lines)",
    "Result": "results/display (a host's deploy decided) vs spec/lock/run (a lock run's output)",
    "SCHEMA_VERSION": "gate/result (the result JSON's schema) vs results/schema (the ledger's migrations)",
    "Sampler": "sim/model (the simulator's noise) vs fleet/soak (a soak's sample source)",
    "Step": "gate/capacity (a probed level), host/outcome (a deploy step), results/display (a step event)",
    "client": "image/engine (the Docker SDK client) vs flows/demo_gateway (the demo's client load)",
    "context": "image/gateway (a build context on disk) vs render/lockctx (a template context)",
    "gateway_target": "host/reach (the gateway's SSH target) vs spec/lock/smg (smg's lock target)",
    "judge": "gate/agreement (output agreement) vs fleet/soak (a soak sample's regressions)",
    "parse": "sim/api (a request body) vs spec/lock/resolve (a lock file)",
    "parser_argv": "image/smoke (in the image) vs spec/lock/verify (in a scratch venv): the same check, two places",
    "render": "flows/fleet_status (the status table) vs sim/metrics (Prometheus text)",
    "run": "effects/proc (a child), effects/aio (an event loop), gate/agreement, cli/main (the console script)",
    "run_once": "image/engine (a container) vs gate/loadgen (one request)",
    "start": "host/local, host/units (a unit) and sim/lm (a completion's first bytes)",
    "status": "effects/http (a GET's status) vs host/converge (a host's status)",
    "table": "flows/rollout (a rollout's table) vs spec/lock/run (a lock's summary)",
}


def _package(mod: str, f: Path) -> str:
    return mod if f.name == "__init__.py" else mod.rsplit(".", 1)[0]


def _public_twins() -> dict[str, set[str]]:
    where: dict[str, set[str]] = {}
    for m, f in _modules().items():
        for n in _tree(f).body:
            names: list[str] = []
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names = [n.name]
            elif isinstance(n, ast.Assign) and not (isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Name)
                                                    and n.value.func.id == "TypeVar"):
                names = [t.id for t in n.targets if isinstance(t, ast.Name)]
            elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
                names = [n.target.id]
            for name in names:
                if not name.startswith("_"):
                    where.setdefault(name, set()).add(m)
    files = _modules()
    return {name: ms for name, ms in where.items() if len({_package(m, files[m]) for m in ms}) > 1}


def test_no_public_name_is_defined_in_two_packages_without_a_reason() -> None:
    found = _public_twins()
    new = sorted(f"{name}: {sorted(found[name])}" for name in set(found) - set(TWINS_ALLOWED))
    assert new == [], "rename one of them, or list it in TWINS_ALLOWED with why both may stay"
    assert set(TWINS_ALLOWED) - set(found) == set(), "gone: remove it from TWINS_ALLOWED"


def test_the_owner_checks_see_what_they_forbid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "stackbuild"
    for rel, text in {
        "__init__.py": "",
        "testing/__init__.py": "",
        "testing/fake_host.py": "class FakeHost: ...\n",
        "host/__init__.py": "",
        "host/deploy.py": "from stackbuild.testing.fake_host import FakeHost\nStep = 1\n",
        "gate/__init__.py": "",
        "gate/run.py": "import urllib.request\nurllib.request.urlopen('x')\nclass Step: ...\n",
        "gate/twin.py": "class Step: ...\n",  # its own package: not a twin
    }.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "PKG", pkg)
    with pytest.raises(AssertionError, match=re.escape("stackbuild.host.deploy -> stackbuild.testing.fake_host")):
        test_only_fakes_and_tests_import_a_fake()
    with pytest.raises(AssertionError, match=re.escape("stackbuild.gate.run:2")):
        test_only_effects_opens_urls()
    assert _public_twins() == {"Step": {"stackbuild.host.deploy", "stackbuild.gate.run", "stackbuild.gate.twin"}}


def test_the_fakes_live_in_testing() -> None:
    """A fake is a module of stackbuild/testing/; no other folder holds one (fabric's testing/)."""
    stray = sorted(m for m, f in _modules().items() if _is_fake(m) and _folder(m) != "testing")
    assert stray == []
