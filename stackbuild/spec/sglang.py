"""Version-aware table of SGLang server flags and SGLANG_* env vars.

Read statically from the release's real wheel (importing sglang imports torch):
dataclass fields in srt/arg_groups/fields/*.py become flags the way
srt/arg_groups/arg_utils.py derives them, plus the manual `add_argument` calls
in srt/server_args.py; env names come from class `Envs` in srt/environ.py.
The table is cached per version under the user cache dir; --offline uses only
the cache.
"""

from __future__ import annotations

import ast
import difflib
import json
import os
import re
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from stackbuild.effects import proc
from stackbuild.errors import InfraError, InputError
from stackbuild.paths import cache_dir

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


# --- cache --------------------------------------------------------------------


def wheel_path(version: str) -> Path | None:
    d = cache_dir() / "sglang" / version
    found = sorted(d.glob("sglang-*.whl")) if d.is_dir() else []
    return found[0] if found else None


def download_argv(version: str, dest: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--disable-pip-version-check",
        "-q",
        f"sglang=={version}",
        "-d",
        str(dest),
    ]


def ensure_wheel(version: str, *, offline: bool) -> Path:
    found = wheel_path(version)
    if found:
        return found
    if offline:
        raise InputError(
            f"sglang {version} is not in the cache ({cache_dir() / 'sglang'}); run once without --offline to fetch it"
        )
    d = cache_dir() / "sglang" / version
    d.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=d) as tmp:
        proc.run(download_argv(version, Path(tmp)), timeout=600, what=f"downloading sglang {version}")
        got = sorted(Path(tmp).glob("sglang-*.whl"))
        if not got:
            raise InfraError(f"pip downloaded no wheel for sglang {version}")
        final = d / got[0].name
        os.replace(got[0], final)  # atomic: a crash leaves no half wheel under its real name
    return final


def load_table(version: str, *, offline: bool = False) -> Table:
    cached = cache_dir() / "sglang" / version / "flags.json"
    if cached.is_file():
        try:
            return Table.from_json(cached.read_text())
        except (ValueError, KeyError):
            pass
    table = table_from_wheel(ensure_wheel(version, offline=offline), version)
    tmp = cached.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(table.to_json())
    os.replace(tmp, cached)
    return table


# --- checks (pure) ---------------------------------------------------------------


@dataclass(frozen=True)
class FlagIssue:
    severity: str
    message: str
    rule: str


def check_flag(table: Table, flag: str, value: object) -> FlagIssue | None:
    v = table.version
    known = table.flags.get(flag)
    if known is None:
        prefixed = sorted({f for f in table.flags if f.startswith(flag)})
        if prefixed:
            alts = " or ".join(prefixed[:4]) + (" ..." if len(prefixed) > 4 else "")
            how = "is ambiguous" if len(prefixed) > 1 else "is only a prefix abbreviation"
            return FlagIssue("error", f"'{flag}' {how} in sglang {v} (did you mean {alts}?)", "sglang-flag")
        close = difflib.get_close_matches(flag, table.spellings, n=1, cutoff=0.75)
        hint = f" (did you mean {close[0]}?)" if close else "; check `python -m sglang.launch_server --help`"
        return FlagIssue("error", f"'{flag}' is not a flag of sglang {v}{hint}", "sglang-flag")
    if known.takes_value and (value is True or value is None):
        return FlagIssue("error", f"'{flag}' takes a value in sglang {v}; give it one", "sglang-flag-value")
    if not known.takes_value and value is not True:
        return FlagIssue(
            "error", f"'{flag}' is a switch in sglang {v}; write `{flag}: true` (or remove it)", "sglang-flag-value"
        )
    if known.deprecated:
        instead = f"; use {known.replacement} instead" if known.replacement else ""
        return FlagIssue("warning", f"'{flag}' is deprecated in sglang {v}{instead}", "sglang-deprecated")
    return None


# Env vars users still set from older guides, with what replaced them.
RETIRED_ENV = {
    "SGLANG_ENABLE_SPEC_V2": "; spec v2 is always on for EAGLE/EAGLE3, use --disable-overlap-schedule "
    "to turn overlap off",
}


def check_env(table: Table, name: str) -> FlagIssue | None:
    if not (name.startswith("SGLANG_") or name.startswith("SGL_")):
        return None
    canonical = "SGLANG_" + name[len("SGL_") :] if name.startswith("SGL_") else name
    if canonical in table.env:
        return None
    close = difflib.get_close_matches(canonical, sorted(table.env), n=1, cutoff=0.88)
    hint = RETIRED_ENV.get(canonical) or (f" (did you mean {close[0]}?)" if close else "; remove it")
    return FlagIssue(
        "error", f"env {name} is not read by sglang {table.version}: it would be silently ignored{hint}", "sglang-env"
    )


# sglang's EnvBool.parse (srt/environ.py): these spellings, case-insensitive; anything else raises
# ValueError when the server reads the variable.
ENV_BOOL_VALUES = ("true", "1", "yes", "y", "false", "0", "no", "n")


def check_env_value(table: Table, name: str, value: str) -> FlagIssue | None:
    canonical = "SGLANG_" + name[len("SGL_") :] if name.startswith("SGL_") else name
    if canonical in table.env_bool and value.lower() not in ENV_BOOL_VALUES:
        return FlagIssue(
            "error",
            f"env {name}={value!r}: sglang {table.version} parses it as a boolean and raises on that value; "
            "use 1/0 or true/false",
            "sglang-env-bool",
        )
    return None
