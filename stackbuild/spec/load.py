"""Loading a stack spec: YAML in, frozen typed `Stack` out — the one boundary for user input.

Loading keeps every node's position, resolves `extends:` (deep merge, parent
first) and applies a variant overlay, then validates with pydantic. Every
problem becomes a `Finding` that points into the YAML file that caused it.
"""

from __future__ import annotations

import difflib
import hashlib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from stackbuild.errors import Finding, SpecError
from stackbuild.paths import StackRef, find_stack, stack_dirs
from stackbuild.spec.kinds import (
    control_chars,
)
from stackbuild.spec.stack import Patch, Stack
from stackbuild.spec.yamlpos import Located, Pos, YamlProblem, load_located

_LOADER_KEYS = ("extends", "variants", "patches")


class RawSpec:
    """A stack file after `extends` resolution: merged data plus positions."""

    def __init__(self, ref: StackRef, data: dict[str, Any], located: Located) -> None:
        self.ref, self.data, self.located = ref, data, located


def _problem(pos: Pos, message: str, rule: str, severity: str = "error") -> Finding:
    return Finding(pos.file, pos.line, pos.col, severity, message, rule)


MAX_SPEC_BYTES = 1 << 20  # a stack spec is a page of YAML; refuse before parsing a huge file


def read_located(path: Path, display: str, what: str = "stack file") -> Located:
    """A YAML spec file (a stack, an inventory) as data with positions; every problem one located line.

    Bytes first: a file too large or not UTF-8 is refused with where and what to do, never a traceback.
    """
    try:
        with path.open("rb") as fh:
            blob = fh.read(MAX_SPEC_BYTES + 1)
    except OSError as err:
        raise SpecError([_problem(Pos(display, 1, 1), f"cannot read {what}: {err.strerror}", "file")]) from err
    if len(blob) > MAX_SPEC_BYTES:
        msg = f"{what} is larger than {MAX_SPEC_BYTES >> 20} MiB; a spec is a page of YAML"
        raise SpecError([_problem(Pos(display, 1, 1), msg, "file")])
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError as err:
        before = blob[: err.start].decode("utf-8", "replace")
        line, col = before.count("\n") + 1, len(before) - (before.rfind("\n") + 1) + 1
        msg = f"byte 0x{blob[err.start]:02x} is not UTF-8; save the file as UTF-8"
        raise SpecError([_problem(Pos(display, line, col), msg, "file")]) from None
    try:
        return load_located(text, display)
    except YamlProblem as p:
        raise SpecError([_problem(p.pos, p.message, p.rule)]) from p


def _read(ref: StackRef) -> Located:
    loc = read_located(ref.path, ref.display)
    if not isinstance(loc.data, dict):
        raise SpecError([_problem(loc.pos(()), "a stack file must be a YAML mapping of keys", "type")])
    return loc


def deep_merge(base: Any, over: Any) -> Any:
    """Mappings merge key by key; anything else (lists too) is replaced; null deletes an inherited key.

    Deleting (not storing None) lets the model's default apply, as `runtime: {shm_size: null}`
    means "not what the parent says"; a null with nothing to delete stays, for optional keys.
    """
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            if v is None and k in out:
                del out[k]
            else:
                out[k] = deep_merge(out[k], v) if k in out else v
        return out
    return over


def _merge_positions(
    into: Located, over: Located, prefix_from: tuple[Any, ...] = (), prefix_to: tuple[Any, ...] = ()
) -> None:
    n = len(prefix_from)
    for table_name in ("values", "keys"):
        src: dict[Any, Pos] = getattr(over, table_name)
        dst: dict[Any, Pos] = getattr(into, table_name)
        for path, pos in src.items():
            if path[:n] == prefix_from and (path != prefix_from or table_name == "values"):
                dst[prefix_to + path[n:]] = pos


def resolve_extends(ref: StackRef, seen: tuple[Path, ...] = ()) -> RawSpec:
    loc = _read(ref)
    data: dict[str, Any] = loc.data
    parent_name = data.get("extends")
    if parent_name is None:
        return RawSpec(ref, data, loc)
    if not isinstance(parent_name, str):
        raise SpecError([_problem(loc.pos(("extends",)), "extends: must be a stack name or a file path", "extends")])
    parent_ref = find_stack(parent_name, near=ref.path.parent, root=ref.root)
    if parent_ref is None:
        raise SpecError(
            [
                _problem(
                    loc.pos(("extends",)),
                    f"extends: no stack '{parent_name}' found; "
                    "name a stack under stacks/ or a path relative to this file",
                    "extends",
                )
            ]
        )
    if parent_ref.path.resolve() in (*seen, ref.path.resolve()):
        chain = " -> ".join(p.name for p in (*seen, ref.path.resolve(), parent_ref.path.resolve()))
        raise SpecError(
            [_problem(loc.pos(("extends",)), f"extends: cycle {chain}; remove one of the links", "extends-cycle")]
        )
    parent = resolve_extends(parent_ref, (*seen, ref.path.resolve()))
    child = {k: v for k, v in data.items() if k != "extends"}
    merged = deep_merge({k: v for k, v in parent.data.items() if k != "name"}, child)
    located = Located(merged, loc.file, dict(parent.located.values), dict(parent.located.keys))
    _merge_positions(located, loc)
    # patches accumulate rather than replace: a child adds fixes on top of its parent's.
    if "patches" in parent.data and "patches" in child:
        merged["patches"] = _patch_list(parent.data["patches"]) + _patch_list(child["patches"])
    return RawSpec(ref, merged, located)


def _patch_list(v: Any) -> list[Any]:
    return list(v) if isinstance(v, list) else [v]


def _apply_variant(raw: RawSpec, variant: str | None) -> tuple[dict[str, Any], Located, list[Finding]]:
    data = dict(raw.data)
    variants = data.pop("variants", None) or {}
    loc = Located(data, raw.located.file, dict(raw.located.values), dict(raw.located.keys))
    if not isinstance(variants, dict):
        return (
            data,
            loc,
            [_problem(raw.located.pos(("variants",)), "variants: must be a mapping of name -> overlay", "type")],
        )
    if variant is None:
        return data, loc, []
    if variant not in variants:
        names = ", ".join(sorted(variants)) or "none"
        where = raw.located.keys.get(("variants",)) or raw.located.pos(())
        return data, loc, [_problem(where, f"unknown variant '{variant}' (this stack has: {names})", "variant")]
    overlay = variants[variant] or {}
    if not isinstance(overlay, dict):
        return (
            data,
            loc,
            [_problem(raw.located.pos(("variants", variant)), "a variant must be a mapping overlay", "type")],
        )
    merged = deep_merge(data, overlay)
    if "patches" in overlay and "patches" in data:
        merged["patches"] = _patch_list(data["patches"]) + _patch_list(overlay["patches"])
    loc2 = Located(merged, loc.file, dict(loc.values), dict(loc.keys))
    _merge_positions(loc2, raw.located, ("variants", variant), ())
    return merged, loc2, []


def _load_patches(data: dict[str, Any], loc: Located, root: Path) -> tuple[list[Patch], list[Finding]]:
    out: list[Patch] = []
    problems: list[Finding] = []
    raw = data.get("patches") or []
    if not isinstance(raw, list):
        return [], [_problem(loc.pos(("patches",)), "patches: must be a list of files under stacks/patches/", "type")]
    for i, item in enumerate(raw):
        if not isinstance(item, str):
            problems.append(_problem(loc.pos(("patches", i)), "patch entries are file paths (strings)", "type"))
            continue
        path = (root / "stacks" / item) if not Path(item).is_absolute() else Path(item)
        if not path.resolve().is_relative_to((root / "stacks" / "patches").resolve()):
            problems.append(
                _problem(
                    loc.pos(("patches", i)),
                    f"patch '{item}' is outside {root / 'stacks' / 'patches'}; keep patches there",
                    "kind",
                )
            )
            continue
        try:
            blob = path.read_bytes()
        except OSError:
            problems.append(
                _problem(
                    loc.pos(("patches", i)),
                    f"patch file '{item}' not found (looked in {path.parent}); add it or fix the path",
                    "missing-file",
                )
            )
            continue
        out.append(Patch(path=path, sha256=hashlib.sha256(blob).hexdigest(), text=blob.decode("utf-8", "replace")))
    return out, problems


def control_char_findings(value: Any, loc: Located, path: tuple[Any, ...] = ()) -> list[Finding]:
    """Every string (key or value) holding a control character, located: no spec value spans lines."""
    out: list[Finding] = []
    if isinstance(value, str):
        if bad := control_chars(value):
            msg = f"{'.'.join(map(str, path)) or 'value'}: control character(s) {''.join(bad)!r} not allowed"
            out.append(_problem(loc.pos(path), msg + "; keep the value on one line of printable text", "kind"))
    elif isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str) and control_chars(k):
                out.append(_problem(loc.keys.get((*path, k), loc.pos(path)), f"key {k!r}: control characters", "kind"))
            out += control_char_findings(v, loc, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += control_char_findings(v, loc, (*path, i))
    return out


def _did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    close = close or [c for c in choices if c.startswith(word) or word.startswith(c)][:1]
    return f" (did you mean '{close[0]}'?)" if close else ""


def _model_at(path: tuple[Any, ...]) -> type[BaseModel] | None:
    model: Any = Stack
    for part in path:
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        f = model.model_fields.get(str(part))
        if f is None:
            # dict[str, Model] values: the key is a user name, skip into the value type
            return None
        ann = f.annotation
        model = _unwrap_model(ann)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _unwrap_model(ann: Any) -> Any:
    args = getattr(ann, "__args__", None)
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    if args:
        for a in args:
            m = _unwrap_model(a)
            if isinstance(m, type) and issubclass(m, BaseModel):
                return m
    return ann


_UNION_TAGS = ("str", "int", "float", "bool", "list[union[str,int,float]]")


def _validation_findings(err: ValidationError, loc: Located) -> list[Finding]:
    findings = []
    for e in err.errors():
        typ = e["type"]
        # pydantic names the member of a union it tried ('str', 'int', ...) in the location; an unknown
        # key is the location's last element itself, whatever it is called (a top-level `bool:`)
        key = e["loc"][-1:] if typ == "extra_forbidden" else ()
        path = tuple(p for p in e["loc"][: len(e["loc"]) - len(key)] if p not in _UNION_TAGS) + key
        where = ".".join(str(p) for p in path) or "(top level)"
        if typ == "extra_forbidden":
            parent = _model_at(path[:-1])
            names = sorted(parent.model_fields) if parent else []
            if path[:-1] == ():
                names = sorted({*names, *_LOADER_KEYS} - {"source", "root", "variant", "variants"} | {"variants"})
            msg = f"{where}: unknown key '{path[-1]}'{_did_you_mean(str(path[-1]), names)}"
            pos = loc.keys.get(path, loc.pos(path))
            findings.append(_problem(pos, msg, "unknown-key"))
        elif typ == "missing":
            findings.append(_problem(loc.pos(path[:-1]), f"{where}: required key is missing; add it", "missing-key"))
        else:
            msg = e["msg"]
            if msg.startswith("Value error, "):
                msg = msg[len("Value error, ") :]
            got = e.get("input")
            shown = repr(got) if not isinstance(got, dict | list) else type(got).__name__
            findings.append(_problem(loc.pos(path), f"{where}: {msg} (got {shown})", "type"))
    # one finding per location: union types report each member's failure
    unique: dict[tuple[int, int, str], Finding] = {}
    for f in findings:
        unique.setdefault((f.line, f.col, f.rule), f)
    return list(unique.values())


def load_stack(name_or_path: str | Path, *, root: Path | None = None, variant: str | None = None) -> Stack:
    """Load, merge and validate one stack; raise SpecError with every problem found."""
    ref = find_stack(str(name_or_path), root=root)
    if ref is None:
        where = ", ".join(str(d) for d in stack_dirs(root)) or "(none)"
        raise SpecError(
            [
                Finding(
                    str(name_or_path),
                    1,
                    1,
                    "error",
                    f"no stack named '{name_or_path}' (looked in {where}); run 'stackbuild list'",
                    "stack",
                )
            ]
        )
    raw = resolve_extends(ref)
    data, loc, problems = _apply_variant(raw, variant)
    variants = raw.data.get("variants") or {}
    patches, patch_problems = _load_patches(data, loc, ref.root)
    problems += patch_problems
    fields = {k: v for k, v in data.items() if k not in _LOADER_KEYS}
    fields.setdefault("name", ref.name)
    fields.update(
        source=ref.path,
        root=ref.root,
        variant=variant,
        patches=patches,
        variants=tuple(variants) if isinstance(variants, dict) else (),
    )
    problems += (control := control_char_findings(fields, loc))
    try:
        stack = Stack.model_validate(fields)
    except ValidationError as err:
        seen = {(f.line, f.col) for f in control}
        problems += [f for f in _validation_findings(err, loc) if (f.line, f.col) not in seen]
    if problems:
        raise SpecError(sorted(problems, key=lambda f: (f.path, f.line, f.col)))
    stack._located = loc
    return stack


def positions(stack: Stack) -> Located:
    """Where each key of the merged spec came from (for rule findings)."""
    return stack._located if stack._located is not None else Located({}, str(stack.source))
