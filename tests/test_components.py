"""The component table is the one place a component is described: a new entry reaches the spec, the lock,
the rules, the Dockerfile and the smoke test with nothing else edited, and no other module spells a
component's distribution name."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from stackbuild.paths import shipped_dir
from stackbuild.spec.components import COMPONENTS, Components

ROOT = shipped_dir("stacks").parent
PKG = Path(__file__).resolve().parents[1] / "stackbuild"

# One new entry, as a contributor adds it. sglang 0.5.23 pins quack-kernels==0.6.5 (its wheel's
# Requires-Dist, in the committed stacks/locks/sglang-0.5.23.flags.json), so the rules have a pin to compare.
NEW_ENTRY = """    Entry("quack", dist="quack-kernels", module="quack", build_tools=("hatchling==1.27.0",),
          source_subdir="python", cmake_defines=(("QUACK_ARCHS", "120"),)),
"""
STACK = """\
base_image: nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04@sha256:""" + "5e" * 32 + """
cuda: "13.0.1"
arches: [sm_120]
components:
  torch: {version: 2.14.1}
  quack:
    version: 0.6.4
    source: {repo: "https://github.com/x/quack.git", ref: v0.6.4}
  sglang: {version: 0.5.23}
server:
  model_path: /models/m
"""
PROBE = """
import json
from stackbuild.image.smoke import expected_versions, imports
from stackbuild.render.stack import render_stack
from stackbuild.spec.load import load_stack
from stackbuild.spec.lock.target import target_of
from stackbuild.spec.rules import check_rules

s = load_stack("s")
t = target_of(s)
r = render_stack(s)
print(json.dumps({
    "components": [n for n, _ in s.components.items()],
    "requirements": t.requirements, "source_built": t.source_built, "sources": t.sources,
    "build_tools": t.build_tools,
    "dockerfile": r.files["Dockerfile"],
    "lock_json": r.lock["components"]["quack"],
    "versions": expected_versions(s), "imports": imports(s, gpu=True),
    "rules": [f"{f.rule}: {f.message}" for f in check_rules(s)],
}))
"""


def test_a_new_component_is_one_entry(tmp_path: Path) -> None:
    """Copy the package, add one entry to its table and nothing else, and follow a stack that uses it."""
    shutil.copytree(PKG, tmp_path / "pkg" / "stackbuild", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "templates", tmp_path / "pkg" / "templates")
    (tmp_path / "pkg" / "pyproject.toml").write_text("")  # shipped_dir: the copy is a checkout
    table = tmp_path / "pkg" / "stackbuild" / "spec" / "components.py"
    text = table.read_text()
    last = '    Entry("sglang", dist="sglang", module="sglang"),\n'
    assert text.count(last) == 1
    table.write_text(text.replace(last, last + NEW_ENTRY))
    (tmp_path / "stacks" / "locks").mkdir(parents=True)
    (tmp_path / "stacks" / "s.yaml").write_text(STACK)
    shutil.copy(ROOT / "stacks" / "locks" / "sglang-0.5.23.flags.json", tmp_path / "stacks" / "locks")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "pkg"), "STACKBUILD_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)

    assert got["components"] == ["torch", "sglang", "quack"]  # the spec key, in the table's order
    assert got["requirements"] == ["torch==2.14.1", "sglang==0.5.23", "quack-kernels==0.6.4"]
    assert got["source_built"] == ["quack-kernels==0.6.4"]
    assert got["sources"] == [["quack-kernels", "https://github.com/x/quack.git", "v0.6.4"]]
    assert got["build_tools"] == ["hatchling==1.27.0"]
    df = got["dockerfile"]
    assert "\nFROM deps AS quack\n" in df
    assert "    && pip wheel --no-build-isolation --no-deps --wheel-dir /wheels/quack \\\n" in df
    assert "       --config-settings=cmake.define.QUACK_ARCHS=120 \\\n       /src/quack/python \\\n" in df
    assert "\nCOPY --from=quack /wheels/quack /wheels/quack\n" in df
    assert got["lock_json"] == {"kind": "source", "version": "0.6.4", "repo": "https://github.com/x/quack.git",
                                "ref": "v0.6.4", "env": {}}
    assert got["versions"] == {"torch": "2.14.1", "sglang": "0.5.23", "quack-kernels": "0.6.4"}
    assert got["imports"] == ["torch", "sglang", "quack"]
    assert got["rules"] == [
        "sglang-pins: quack 0.6.4 disagrees with sglang 0.5.23, which pins 0.6.5; pin 0.6.5 or change sglang"
    ]


def test_the_spec_keys_are_the_table() -> None:
    assert list(Components.model_fields) == [e.name for e in COMPONENTS]
    for e in COMPONENTS:
        assert Components.model_fields[e.name].annotation == e.model | None


def _strings(tree: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def test_each_distribution_name_is_spelled_in_the_table_only() -> None:
    """A distribution name that is neither the component's key nor its import name ("sglang-kernel",
    "flashinfer-python") appears in no string of any other module (comments may still name it)."""
    own = [e.dist for e in COMPONENTS if e.dist not in (e.name, e.module)]
    assert own == ["sglang-kernel", "flashinfer-python"]
    table = PKG / "spec" / "components.py"
    spelled = sorted(
        f"{f.relative_to(PKG)}: {d}"
        for f in PKG.rglob("*.py") if f != table
        for s in _strings(ast.parse(f.read_text(encoding="utf-8")))
        for d in own if d in s
    )
    assert spelled == []

