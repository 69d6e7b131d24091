"""SGLang server flags and SGLANG_* env vars of the pinned release, and the checks against them.

The table is read statically from the release's real wheel (sglang_table). Where a
table comes from, first found: the one committed beside the locks
(stacks/locks/sglang-VERSION.flags.json, written by `stackbuild lock`, so a fresh
clone validates offline), the user cache (per version), else the wheel itself,
downloaded into the cache (never with --offline).
"""

from __future__ import annotations

import difflib
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from stackbuild.effects import proc
from stackbuild.errors import InfraError, InputError
from stackbuild.paths import cache_dir, shipped_dir
from stackbuild.spec.components import dist_of
from stackbuild.spec.sglang_table import TABLE_FORMAT as TABLE_FORMAT
from stackbuild.spec.sglang_table import Flag as Flag
from stackbuild.spec.sglang_table import Table, table_from_wheel

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
        f"{dist_of('sglang')}=={version}",
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


def table_name(version: str) -> str:
    """The committed table's file name, beside the locks."""
    return f"sglang-{version}.flags.json"


def committed_dirs(root: Path | None) -> list[Path]:
    """Where committed tables are looked up: the project's stacks/locks, then the shipped one's."""
    dirs = [root / "stacks" / "locks"] if root is not None else []
    shipped = shipped_dir("stacks") / "locks"
    return [*dirs, shipped] if shipped not in dirs else dirs


def _read(path: Path) -> Table | None:
    try:
        return Table.from_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, KeyError):
        return None  # absent, or written by another table format: not an answer


def committed_table(version: str, root: Path | None = None) -> Table | None:
    """The table committed beside the project's locks (or the shipped ones), in the current format."""
    for d in committed_dirs(root):
        found = _read(d / table_name(version))
        if found is not None:
            return found
    return None


def known_table(version: str, root: Path | None = None) -> Table | None:
    """The committed table, else the cached one; never downloads."""
    return committed_table(version, root) or _read(cache_dir() / "sglang" / version / "flags.json")


def _store(table: Table, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.fchmod(fd, 0o644)  # a file to commit and share, not mkstemp's private 0600
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(table.to_json() + "\n")
    os.replace(tmp, path)


def table_of_wheel(version: str) -> Table:
    """Read afresh from the release's wheel (downloaded once into the cache); refreshes the cached table."""
    table = table_from_wheel(ensure_wheel(version, offline=False), version)
    _store(table, cache_dir() / "sglang" / version / "flags.json")
    return table


def load_table(version: str, *, offline: bool = False, root: Path | None = None) -> Table:
    found = known_table(version, root)
    if found is not None:
        return found
    if offline:
        raise InputError(
            f"sglang {version}: no flag table in stacks/locks/ ({table_name(version)}) nor in the cache "
            f"({cache_dir() / 'sglang'}); run `stackbuild lock STACK` once online, which writes it beside the "
            "lock to commit, or drop --offline"
        )
    return table_of_wheel(version)


def write_table(table: Table, locks_dir: Path) -> Path:
    """The committed copy, beside the locks (temp name, then rename)."""
    path = locks_dir / table_name(table.version)
    _store(table, path)
    return path


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


# sglang's EnvBool (0.5.23 srt/environ.py:143-150): these spellings, case-insensitive, mean true or false;
# any other value makes EnvField.get (environ.py:67-86) warn "Invalid value" and return the default.
ENV_TRUE = ("true", "1", "yes", "y")
ENV_FALSE = ("false", "0", "no", "n")
ENV_BOOL_VALUES = ENV_TRUE + ENV_FALSE


def env_bool(value: str | None, default: bool) -> bool:
    """What sglang's EnvBool.get() returns for an env value (None: unset)."""
    if value is None or value.lower() not in ENV_BOOL_VALUES:
        return default
    return value.lower() in ENV_TRUE


def check_env_value(table: Table, name: str, value: str) -> FlagIssue | None:
    canonical = "SGLANG_" + name[len("SGL_") :] if name.startswith("SGL_") else name
    if canonical in table.env_bool and value.lower() not in ENV_BOOL_VALUES:
        return FlagIssue(
            "error",
            f"env {name}={value!r}: sglang {table.version} reads it as a boolean (true/1/yes/y or false/0/no/n), "
            "warns 'Invalid value' and keeps the default; use 1/0 or true/false",
            "sglang-env-bool",
        )
    return None
