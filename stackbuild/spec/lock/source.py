"""A source build's `ref` resolved to the commit it names, the way `git clone --branch REF` picks it.

`git ls-remote URL REF` answers for any git URL without cloning. clone's --branch looks
for refs/heads/REF first, then refs/tags/REF (an annotated tag peeled to its commit, the
`^{}` line); a full commit id is its own answer.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from stackbuild.effects import proc
from stackbuild.errors import InfraError, InputError

_SHA_RE = re.compile(r"[0-9a-f]{40}")
Run = Callable[..., proc.Completed]


def ls_remote_argv(repo: str, ref: str) -> list[str]:
    # `--` ends options: a ref or URL starting with '-' is never read as one. Patterns match refnames from
    # their tail, so an annotated tag's peeled line (refs/tags/REF^{}) needs a pattern of its own.
    return ["git", "ls-remote", "--", repo, ref, f"{ref}^{{}}"]


def commit_of(output: str, ref: str) -> str | None:
    """The commit `ref` names in `git ls-remote` output (pure)."""
    refs: dict[str, str] = {}
    for line in output.splitlines():
        sha, _, name = line.partition("\t")
        if _SHA_RE.fullmatch(sha):
            refs[name.strip()] = sha
    for name in (f"refs/heads/{ref}", f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}", ref):
        if name in refs:
            return refs[name]
    return None


def resolve_ref(repo: str, ref: str, *, run: Run = proc.run) -> str:
    """The 40-hex commit of `ref` in `repo` (asks the remote; a full commit id needs no asking)."""
    if _SHA_RE.fullmatch(ref):
        return ref
    done = run(ls_remote_argv(repo, ref), check=False, timeout=120, what=f"git ls-remote {repo}")
    if done.returncode != 0:
        raise InfraError(
            f"cannot list the refs of {repo}", command=done.command, returncode=done.returncode, output=done.stderr
        )
    sha = commit_of(done.stdout, ref)
    if sha is None:
        raise InputError(f"{repo} has no branch or tag '{ref}'; fix source.ref")
    return sha
