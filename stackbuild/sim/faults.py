"""Fault injection: parsed once from `--fault NAME[:ARG]`, then consulted by the server."""

from __future__ import annotations

from dataclasses import dataclass

from stackbuild.sim.lm import Numerics

FAULTS = (
    "crash-on-start",
    "never-ready",
    "fail-first-generation",
    "garbage",
    "slow",
    "die-after",
    "stall-stream",
    "diverge",
    "drift",
)
GARBAGE_KINDS = ("repeat", "empty", "fffd")


@dataclass(frozen=True)
class Fault:
    name: str | None = None
    factor: float = 1.0  # slow:FACTOR
    after: int = 0  # die-after:N
    garbage: str = "repeat"  # garbage[:repeat|empty|fffd]

    @property
    def numerics(self) -> Numerics:
        """How this server's kernels compute the next-token distribution (stackbuild.sim.lm)."""
        if self.name == "diverge":
            return Numerics("diverge", self.after)
        if self.name == "drift":
            return Numerics("drift")
        return Numerics()

    @property
    def slow(self) -> float:
        return self.factor if self.name == "slow" else 1.0


def parse_fault(spec: str | None) -> Fault:
    """Parse a fault spec; raises ValueError with a sentence saying what is accepted."""
    if not spec:
        return Fault()
    name, _, arg = spec.partition(":")
    if name not in FAULTS:
        raise ValueError(f"unknown fault {spec!r}; use one of: {', '.join(FAULTS)}")
    if name == "slow":
        try:
            factor = float(arg)
        except ValueError:
            raise ValueError("slow needs a factor > 0, e.g. --fault slow:1.5") from None
        if factor <= 0:
            raise ValueError("slow needs a factor > 0, e.g. --fault slow:1.5")
        return Fault(name, factor=factor)
    if name in ("die-after", "diverge"):
        if not arg.isdigit():
            what = "a request count, e.g. --fault die-after:20" if name == "die-after" else \
                "the output token where near ties start to flip, e.g. --fault diverge:8"
            raise ValueError(f"{name} needs {what}")
        return Fault(name, after=int(arg))
    if name == "garbage":
        kind = arg or "repeat"
        if kind not in GARBAGE_KINDS:
            raise ValueError(f"garbage takes one of {', '.join(GARBAGE_KINDS)}")
        return Fault(name, garbage=kind)
    if arg:
        raise ValueError(f"fault {name} takes no argument")
    return Fault(name)
