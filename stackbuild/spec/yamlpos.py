"""YAML -> plain data plus the file:line:col of every key and value.

PyYAML's composer keeps node marks; the constructor throws them away. We walk
the composed node tree ourselves so every error can point into the file.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import yaml

Path_ = tuple[str | int, ...]

# Bounds on what one spec may cost: a stack spec is a page of YAML, so these are far above
# any real one and far below what aliases ("billion laughs") or deep nesting could ask for.
MAX_NODES = 20_000
MAX_DEPTH = 50


@dataclass(frozen=True)
class Pos:
    file: str
    line: int  # 1-based
    col: int  # 1-based


@dataclass
class Located:
    """Data loaded from one YAML document, with positions by path."""

    data: Any
    file: str
    values: dict[Path_, Pos] = field(default_factory=dict)
    keys: dict[Path_, Pos] = field(default_factory=dict)

    def pos(self, path: Path_) -> Pos:
        """Best position for `path`: the value, else its key, else the nearest parent."""
        p = tuple(path)
        while True:
            if p in self.values:
                return self.values[p]
            if p in self.keys:
                return self.keys[p]
            if not p:
                return Pos(self.file, 1, 1)
            p = p[:-1]


class YamlProblem(Exception):
    def __init__(self, pos: Pos, message: str, rule: str) -> None:
        self.pos, self.message, self.rule = pos, message, rule
        super().__init__(message)


def _pos(file: str, node: yaml.Node) -> Pos:
    return Pos(file, node.start_mark.line + 1, node.start_mark.column + 1)


class _TooDeep(Exception):
    def __init__(self, mark: yaml.Mark | None) -> None:
        self.mark = mark


class _Constructor(yaml.SafeLoader):
    """Only used for scalar resolution and merge-key flattening; composing is bounded in depth.

    PyYAML composes nodes recursively: without a bound, 3000 nested brackets run until Python's
    recursion limit (seconds of work, and a position-less error). Counting here stops at the
    first node past the limit, where its mark is known.
    """

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH + 1:  # the document's root is depth 1, its values depth 2...
                raise _TooDeep(self.peek_event().start_mark)  # type: ignore[no-untyped-call]
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def load_located(text: str, file: str) -> Located:
    """Parse one YAML document; raise YamlProblem with a position on any error.

    A pure function of the text and the name: a command reads the same stack files several
    times (its own, the stacks it extends, every stack `validate` checks), and the position-keeping
    composer is pure Python, so a parse is kept and each caller gets its own copy to change."""
    return copy.deepcopy(_load_located(text, file))


@lru_cache(maxsize=64)
def _load_located(text: str, file: str) -> Located:
    try:
        loader = _Constructor(text)
        try:
            node = loader.get_single_node()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        pos = Pos(file, mark.line + 1, mark.column + 1) if mark else Pos(file, 1, 1)
        problem = (err.problem or err.context or "invalid YAML").strip()
        raise YamlProblem(pos, f"YAML syntax: {problem}; fix the YAML at this spot", "yaml-syntax") from err
    except yaml.reader.ReaderError as err:
        before = text[: err.position]
        pos = Pos(file, before.count("\n") + 1, len(before) - (before.rfind("\n") + 1) + 1)
        raise YamlProblem(
            pos, f"YAML: character {err.character!r} is not allowed in YAML; remove it", "yaml-syntax"
        ) from err
    except yaml.YAMLError as err:
        raise YamlProblem(Pos(file, 1, 1), f"YAML: {' '.join(str(err).split())}", "yaml-syntax") from err
    except _TooDeep as err:
        pos = Pos(file, err.mark.line + 1, err.mark.column + 1) if err.mark else Pos(file, 1, 1)
        raise YamlProblem(pos, f"YAML nested deeper than {MAX_DEPTH} levels; flatten it", "yaml-limit") from None
    except RecursionError:  # a limit below ours (a deep stack already): still one line, never a traceback
        raise YamlProblem(Pos(file, 1, 1), f"YAML nested deeper than {MAX_DEPTH} levels; flatten it",
                          "yaml-limit") from None
    out = Located(data=None, file=file)
    if node is None:
        out.data = {}
        return out
    out.data = _walk(node, (), out, loader, [0])
    return out


def _walk(node: yaml.Node, path: Path_, out: Located, loader: _Constructor, count: list[int]) -> Any:
    count[0] += 1
    if count[0] > MAX_NODES:
        raise YamlProblem(_pos(out.file, node), f"YAML expands to more than {MAX_NODES} values (aliases "
                          "repeating aliases?); write the values out", "yaml-limit")
    if len(path) > MAX_DEPTH:
        raise YamlProblem(_pos(out.file, node), f"YAML nested deeper than {MAX_DEPTH} levels; flatten it",
                          "yaml-limit")
    out.values[path] = _pos(out.file, node)
    if isinstance(node, yaml.MappingNode):
        try:
            loader.flatten_mapping(node)
        except yaml.MarkedYAMLError as err:
            raise YamlProblem(_pos(out.file, node), f"YAML merge key: {err.problem}", "yaml-syntax") from err
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = _scalar(key_node, out, loader)
            if not isinstance(key, str | int | float | bool) or isinstance(key, bool):
                raise YamlProblem(
                    _pos(out.file, key_node), "mapping keys must be plain strings; quote the key", "yaml-key"
                )
            skey = str(key)
            if skey in result:
                raise YamlProblem(
                    _pos(out.file, key_node),
                    f"duplicate key '{skey}' (YAML keeps only the last one); remove one of them",
                    "duplicate-key",
                )
            out.keys[(*path, skey)] = _pos(out.file, key_node)
            result[skey] = _walk(value_node, (*path, skey), out, loader, count)
        return result
    if isinstance(node, yaml.SequenceNode):
        return [_walk(child, (*path, i), out, loader, count) for i, child in enumerate(node.value)]
    return _scalar(node, out, loader)


def _scalar(node: yaml.Node, out: Located, loader: _Constructor) -> Any:
    if not isinstance(node, yaml.ScalarNode):
        raise YamlProblem(_pos(out.file, node), "a mapping or list cannot be used as a key", "yaml-key")
    try:
        return loader.construct_object(node, deep=True)
    except yaml.YAMLError as err:
        raise YamlProblem(_pos(out.file, node), f"bad scalar: {err}", "yaml-syntax") from err
