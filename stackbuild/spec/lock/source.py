"""A source build's `ref` resolved to the commit it names, the way `git clone --branch REF` picks it.

`git ls-remote URL REF` answers for any git URL without cloning. clone's --branch looks
for refs/heads/REF first, then refs/tags/REF (an annotated tag peeled to its commit, the
`^{}` line). A full commit id is its own answer, but `clone --branch` cannot take one and
ls-remote lists only tips: it is fetched by id (`git fetch --depth 1 REPO SHA`), at lock
time to prove the repository has it and in the build to check it out.
"""

from __future__ import annotations

import re
import tempfile
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


def is_commit(ref: str) -> bool:
    """A full commit id: `git clone --branch` cannot take it; the build fetches it by id instead."""
    return _SHA_RE.fullmatch(ref) is not None


def fetch_commit_argv(git_dir: str, repo: str, sha: str) -> list[str]:
    """What the build runs for a commit ref (and `lock` to check it exists): one commit, no history."""
    return ["git", "-C", git_dir, "fetch", "--quiet", "--depth", "1", "--", repo, sha]


# upload-pack's answer to a want it does not have (the commit is not in the repository)
_NO_COMMIT = ("not our ref", "couldn't find remote ref", "no such remote ref")


def check_commit(repo: str, sha: str, *, run: Run = proc.run) -> str:
    """`sha` if `repo` has that commit: fetched by id into a scratch repository, as the build fetches it."""
    with tempfile.TemporaryDirectory(prefix="stackbuild-ref-") as tmp:
        run(["git", "init", "--quiet", tmp], timeout=60, what="git init (scratch)")
        done = run(fetch_commit_argv(tmp, repo, sha), check=False, timeout=300, what=f"git fetch {repo} {sha}")
    if done.returncode == 0:
        return sha
    if any(m in done.stderr for m in _NO_COMMIT):
        raise InputError(f"{repo} has no commit {sha}; fix source.ref")
    raise InfraError(f"cannot fetch {sha} from {repo}", command=done.command, returncode=done.returncode,
                     output=done.stderr)


def resolve_ref(repo: str, ref: str, *, run: Run = proc.run) -> str:
    """The 40-hex commit of `ref` in `repo` (asks the remote; a full commit id is fetched by id to prove it exists)."""
    if is_commit(ref):
        return check_commit(repo, ref, run=run)
    done = run(ls_remote_argv(repo, ref), check=False, timeout=120, what=f"git ls-remote {repo}")
    if done.returncode != 0:
        raise InfraError(
            f"cannot list the refs of {repo}", command=done.command, returncode=done.returncode, output=done.stderr
        )
    sha = commit_of(done.stdout, ref)
    if sha is None:
        raise InputError(f"{repo} has no branch or tag '{ref}'; fix source.ref")
    return sha
