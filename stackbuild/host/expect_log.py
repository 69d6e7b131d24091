"""Does a server's startup log show the path its variant claims (server.expect_log)? Pure.

A variant named for a code path (an all-reduce backend) is measured only once its log proves the
server took that path: sglang falls back silently (a warning, then NCCL), so a variant whose
fallback ran would otherwise fill the results table with another path's numbers. The readiness
step (host/deploy_steps.py) reads the unit's journal since its start and calls `unmet`; a failed
expectation is a start failure with the line as its cause.
"""

from __future__ import annotations

from stackbuild.spec.stack import ExpectLog


def unmet(expect: ExpectLog, log: str) -> str | None:
    """Why `log` does not meet `expect` (one sentence naming the line and its source), or None."""
    lines = log.splitlines()
    for bad in expect.absent:
        seen = next((ln.strip() for ln in lines if bad.text in ln), None)
        if seen is not None:
            return (f"the startup log shows {bad}, a line the variant says must not appear: "
                    f"the server took another path than it claims ({seen[:240]!r})")
    for want in expect.present:
        if not any(want.text in ln for ln in lines):
            return (f"the startup log never shows {want}: the server did not take the path the variant "
                    "claims, so its numbers would not be that path's")
    return None
