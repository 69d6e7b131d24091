"""Check that each SGLang patch applies cleanly to the pinned release's source.

The source comes from the release's real wheel (cached by stackbuild.spec.sglang);
only the files a patch touches are extracted. GNU patch does the dry run.
"""

from __future__ import annotations

import re
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from stackbuild.effects import proc

_FILE_RE = re.compile(r"^\+\+\+ (?:b/)?(\S+)", re.MULTILINE)
_HUNK_FAIL_RE = re.compile(r"Hunk #(\d+) FAILED at (\d+)")


@dataclass(frozen=True)
class PatchIssue:
    message: str
    line: int = 1  # line in the patch file to point at
    severity: str = "error"


def touched_files(text: str) -> list[str]:
    return [f for f in _FILE_RE.findall(text) if f != "/dev/null"]


@dataclass(frozen=True)
class Change:
    """What a patch does to one file: the lines its hunks remove and add (without the -/+)."""

    removed: tuple[str, ...]
    added: tuple[str, ...]


_HUNK_RE = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


def changes(text: str) -> dict[str, Change]:
    """file (as in `+++ b/FILE`) -> its removed and added lines, over all its hunks (pure). A hunk is read
    for as many lines as its header counts, so a removed line that itself starts with '-- ' stays one."""
    out: dict[str, tuple[list[str], list[str]]] = {}
    current: tuple[list[str], list[str]] | None = None
    old = new = 0
    for ln in text.splitlines():
        if ln.startswith("\\"):  # "\ No newline at end of file": not a line of either side
            continue
        if old > 0 or new > 0:
            if current is not None and ln.startswith("-"):
                current[0].append(ln[1:])
            elif current is not None and ln.startswith("+"):
                current[1].append(ln[1:])
            old -= not ln.startswith("+")
            new -= not ln.startswith("-")
        elif ln.startswith("+++ "):
            name = ln[4:].split("\t")[0].strip().removeprefix("b/")
            current = out.setdefault(name, ([], [])) if name != "/dev/null" else None
        elif m := _HUNK_RE.match(ln):
            old, new = int(m.group(1) or 1), int(m.group(2) or 1)
    return {f: Change(tuple(r), tuple(a)) for f, (r, a) in out.items()}


def hunk_line(text: str, file: str, hunk: int) -> int:
    """1-based line in the patch where hunk `hunk` (1-based) of `file` starts."""
    lines = text.splitlines()
    in_file, seen = False, 0
    for i, ln in enumerate(lines, 1):
        if ln.startswith("+++ "):
            in_file = ln[4:].split("\t")[0].removeprefix("b/") == file
        elif in_file and ln.startswith("@@"):
            seen += 1
            if seen == hunk:
                return i
    return 1


def dry_run_argv(patch: Path, target: Path, *, reverse: bool = False) -> list[str]:
    argv = ["patch", "--dry-run", "--batch", "--forward", "-p1", "-d", str(target), "-i", str(patch)]
    if reverse:
        argv = ["patch", "--dry-run", "--batch", "--reverse", "-p1", "-d", str(target), "-i", str(patch)]
    return argv


def check_patch(patch_path: Path, text: str, wheel: Path, version: str) -> list[PatchIssue]:
    files = touched_files(text)
    if not files:
        return [PatchIssue("not a unified diff (no '+++ b/...' lines); make it with `diff -u` or `git diff`")]
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as z:
        members = set(z.namelist())
        issues = []
        for f in files:
            if f not in members:
                issues.append(
                    PatchIssue(
                        f"patches {f}, which sglang {version} does not ship; "
                        "paths must be relative to site-packages (a/sglang/...)",
                        _line_of(text, f),
                    )
                )
            else:
                dest = Path(tmp) / f
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(z.read(f))
        if issues:
            return issues
        fwd = proc.run(dry_run_argv(patch_path, Path(tmp)), check=False, timeout=60)
        if fwd.returncode == 0:
            return []
        out = fwd.stdout + fwd.stderr
        rev = proc.run(dry_run_argv(patch_path, Path(tmp), reverse=True), check=False, timeout=60)
        if rev.returncode == 0:
            return [PatchIssue(f"already applied upstream in sglang {version}; drop this patch", 1, "warning")]
        return _failures(out, text, version) or [
            PatchIssue(
                f"does not apply to sglang {version}: {out.strip().splitlines()[-1] if out.strip() else 'patch failed'}"
            )
        ]


def _line_of(text: str, file: str) -> int:
    for i, ln in enumerate(text.splitlines(), 1):
        if ln.startswith("+++ ") and file in ln:
            return i
    return 1


def _failures(output: str, text: str, version: str) -> list[PatchIssue]:
    issues = []
    current = None
    for ln in output.splitlines():
        m = re.match(r"(?:checking|patching) file (\S+)", ln)
        if m:
            current = m.group(1)
            continue
        m = _HUNK_FAIL_RE.search(ln)
        if m and current:
            hunk, at = int(m.group(1)), int(m.group(2))
            issues.append(
                PatchIssue(
                    f"hunk #{hunk} of {current} does not apply to sglang {version} "
                    f"(expected near line {at}); rebase the patch on {version}",
                    hunk_line(text, current, hunk),
                )
            )
    return issues
