"""The flag/env table of one SGLang release, read statically from its wheel's sources (pure).

Dataclass fields in srt/arg_groups/fields/*.py become flags the way
srt/arg_groups/arg_utils.py derives them, plus the manual `add_argument` calls in
srt/server_args.py; env names come from class `Envs` in srt/environ.py, and the
release's exact pins from its METADATA. Importing sglang would import torch.
"""

from __future__ import annotations

import ast
import json
import re
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from stackbuild.errors import InfraError

TABLE_FORMAT = 3  # 3: env_bool


@dataclass(frozen=True)
class Flag:
    name: str
    aliases: tuple[str, ...] = ()
    takes_value: bool = True
    deprecated: bool = False
    replacement: str | None = None


@dataclass
class Table:
    version: str
    flags: dict[str, Flag] = field(default_factory=dict)  # every spelling -> Flag
    env: frozenset[str] = frozenset()
    requires: dict[str, str] = field(default_factory=dict)  # dist name -> exact pin
    env_bool: frozenset[str] = frozenset()  # declared EnvBool*: parsed strictly, see check_env_value

    def to_json(self) -> str:
        canon = {f.name: asdict(f) for f in self.flags.values()}
        return json.dumps(
            {
                "format": TABLE_FORMAT,
                "version": self.version,
                "flags": canon,
                "env": sorted(self.env),
                "env_bool": sorted(self.env_bool),
                "requires": self.requires,
            },
            indent=1,
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> Table:
        d = json.loads(text)
        if d.get("format") != TABLE_FORMAT:
            raise ValueError("old table format")
        t = cls(
            d["version"], env=frozenset(d["env"]), requires=d.get("requires", {}), env_bool=frozenset(d["env_bool"])
        )
        for f in d["flags"].values():
            flag = Flag(f["name"], tuple(f["aliases"]), f["takes_value"], f["deprecated"], f["replacement"])
            t.add(flag)
        return t

    def add(self, flag: Flag) -> None:
        for spelling in (flag.name, *flag.aliases):
            self.flags[spelling] = flag

    @property
    def spellings(self) -> list[str]:
        return sorted(self.flags)


# --- static extraction ------------------------------------------------------

_DEPRECATED_RE = re.compile(r"^\(?\s*deprecated\b", re.IGNORECASE)
_USE_RE = re.compile(r"\buse\s+'?(--[a-z0-9][a-z0-9-]*(?:[= ][^\s)'.]+)?)", re.IGNORECASE)


def _const_str(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):  # f-string: keep the literal parts
        return "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _const_str(node.left), _const_str(node.right)
        return (a or "") + (b or "") if a is not None or b is not None else None
    return None


def _str_list(node: ast.AST | None) -> list[str]:
    if isinstance(node, ast.List | ast.Tuple):
        return [s for e in node.elts if (s := _const_str(e))]
    return []


def _deprecation(help_text: str, action: str | None, new_flag: str | None) -> tuple[bool, str | None]:
    dep = bool(action and action.startswith("Deprecated")) or bool(_DEPRECATED_RE.match(help_text.strip()))
    if not dep:
        return False, None
    if new_flag:
        return True, new_flag
    m = _USE_RE.search(help_text)
    return True, (m.group(1) if m else None)


def _is_bool(tp: ast.AST) -> bool:
    if isinstance(tp, ast.Name):
        return tp.id == "bool"
    if isinstance(tp, ast.Subscript) and isinstance(tp.value, ast.Name) and tp.value.id == "Optional":
        return _is_bool(tp.slice)
    if isinstance(tp, ast.BinOp):  # bool | None
        return _is_bool(tp.left) or _is_bool(tp.right)
    return False


def _fields_flags(tree: ast.Module) -> list[Flag]:
    out = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for stmt in cls.body:
            if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
                continue
            ann = stmt.annotation
            if not (
                isinstance(ann, ast.Subscript)
                and isinstance(ann.value, ast.Name)
                and ann.value.id in ("A", "Annotated")
                and isinstance(ann.slice, ast.Tuple)
            ):
                continue
            inner, *meta = ann.slice.elts
            help_text, aliases, cli_name, action, new_flag = None, [], None, None, None
            no_cli = False
            for m in meta:
                if (s := _const_str(m)) is not None and help_text is None:
                    help_text = s
                elif isinstance(m, ast.Call) and isinstance(m.func, ast.Name) and m.func.id == "Arg":
                    help_text = help_text or ""
                    for kw in m.keywords:
                        if kw.arg == "help":
                            help_text = _const_str(kw.value) or ""
                        elif kw.arg == "aliases":
                            aliases = _str_list(kw.value)
                        elif kw.arg == "cli_name":
                            cli_name = _const_str(kw.value)
                        elif kw.arg == "no_cli":
                            no_cli = isinstance(kw.value, ast.Constant) and kw.value.value is True
                        elif kw.arg == "action":
                            action = ast.unparse(kw.value)
                        elif kw.arg == "action_kwargs" and isinstance(kw.value, ast.Dict):
                            for k, v in zip(kw.value.keys, kw.value.values, strict=False):
                                if _const_str(k) == "new_flag":
                                    new_flag = _const_str(v)
            if help_text is None or no_cli:
                continue  # not an Arg-annotated field: argparse never sees it
            name = cli_name or "--" + stmt.target.id.replace("_", "-")
            dep, repl = _deprecation(help_text, action, new_flag)
            takes_value = not _is_bool(inner) and not (action and "StoreTrue" in action)
            if action and action in ("'store_true'", '"store_true"'):
                takes_value = False
            out.append(Flag(name, tuple(aliases), takes_value, dep, repl))
    return out


def _add_argument_flags(tree: ast.Module) -> list[Flag]:
    out = []
    for call in (n for n in ast.walk(tree) if isinstance(n, ast.Call)):
        if not (isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument"):
            continue
        names = [s for a in call.args if (s := _const_str(a)) and s.startswith("--")]
        if not names:
            continue
        kws = {kw.arg: kw.value for kw in call.keywords if kw.arg}
        action_node = kws.get("action")
        action = (_const_str(action_node) or ast.unparse(action_node)) if action_node is not None else None
        help_text = _const_str(kws.get("help")) or ""
        dep, repl = _deprecation(help_text, action, _const_str(kws.get("new_flag")))
        nargs = kws.get("nargs")
        takes_value = not (
            action in ("store_true", "store_false")
            or (action and "StoreTrue" in action)
            or (isinstance(nargs, ast.Constant) and nargs.value == 0)
        )
        out.append(Flag(names[0], tuple(names[1:]), takes_value, dep, repl))
    return out


def _env_bools(tree: ast.Module) -> set[str]:
    """Envs attributes declared `NAME = EnvBool(...)` (or EnvBoolWithAlias)."""
    names: set[str] = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "Envs"):
        for stmt in cls.body:
            if (
                isinstance(stmt, ast.Assign)
                and isinstance(stmt.value, ast.Call)
                and isinstance(stmt.value.func, ast.Name)
                and stmt.value.func.id.startswith("EnvBool")
            ):
                names |= {t.id for t in stmt.targets if isinstance(t, ast.Name)}
    return names


def _env_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "Envs"):
        for stmt in cls.body:
            targets = (
                stmt.targets
                if isinstance(stmt, ast.Assign)
                else [stmt.target]
                if isinstance(stmt, ast.AnnAssign)
                else []
            )
            names |= {t.id for t in targets if isinstance(t, ast.Name) and t.id.isupper()}
    return names


_REQ_RE = re.compile(r"^Requires-Dist:\s*([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?\s*\(?==\s*([^\s;,)]+)")


def _requires(metadata: str) -> dict[str, str]:
    pins = {}
    for line in metadata.splitlines():
        if "extra ==" in line:
            continue
        m = _REQ_RE.match(line)
        if m:
            pins[m.group(1).lower().replace("_", "-")] = m.group(2)
    return pins


def table_from_wheel(wheel: Path, version: str) -> Table:
    t = Table(version)
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()

        def parse(member: str) -> ast.Module:
            return ast.parse(z.read(member).decode("utf-8"), member)

        for member in sorted(n for n in names if re.match(r"sglang/srt/arg_groups/fields/[^/]+\.py$", n)):
            for f in _fields_flags(parse(member)):
                t.add(f)
        for f in _add_argument_flags(parse("sglang/srt/server_args.py")):
            if f.name not in t.flags:
                t.add(f)
        environ = parse("sglang/srt/environ.py")
        t.env = frozenset(_env_names(environ))
        t.env_bool = frozenset(_env_bools(environ))
        meta = next((n for n in names if n.endswith(".dist-info/METADATA")), None)
        if meta:
            t.requires = _requires(z.read(meta).decode("utf-8", "replace"))
    if len(t.flags) < 50:
        raise InfraError(
            f"sglang {version}: found only {len(t.flags)} flags in {wheel.name}; "
            "its layout is not one stackbuild knows how to read"
        )
    return t
