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
    "detokenizer",
    "chat-template",
    "long-context",
    "concurrency",
)
GARBAGE_KINDS = ("repeat", "empty", "fffd")
# faults that take a count, and what it is
_COUNTS = {
    "die-after": "a request count, e.g. --fault die-after:20",
    "diverge": "the output token where near ties start to flip, e.g. --fault diverge:8",
    "long-context": "the context length (tokens) from which outputs are wrong, "
                    "e.g. --fault long-context:300",
    "concurrency": "the number of requests in flight above which outputs are wrong, "
                   "e.g. --fault concurrency:12",
}


@dataclass(frozen=True)
class Fault:
    name: str | None = None
    factor: float = 1.0  # slow:FACTOR
    after: int = 0  # die-after:N, diverge:N, long-context:N, concurrency:K
    garbage: str = "repeat"  # garbage[:repeat|empty|fffd]

    @property
    def numerics(self) -> Numerics:
        """How this server's kernels compute the next-token distribution (stackbuild.sim.lm)."""
        if self.name == "diverge":
            return Numerics("diverge", self.after)
        if self.name == "drift":
            return Numerics("drift")
        if self.name == "long-context":  # right below N tokens of context, wrong from there
            return Numerics("drift", self.after)
        return Numerics()

    def numerics_at(self, in_flight: int) -> Numerics:
        """The numerics a request gets when it arrives with `in_flight` requests in the server
        (itself included). concurrency:K: a kernel wrong at batch sizes above K (another
        CUDA graph or GEMM tile picked for big batches); the simulator decides a request's
        tokens when it arrives, so the batch it arrives into decides, not later steps."""
        if self.name == "concurrency":
            return Numerics("drift") if in_flight > self.after else Numerics()
        return self.numerics

    @property
    def legacy_space(self) -> bool:
        """detokenizer: the same ids decode to other text (stackbuild.sim.text.detokenize)."""
        return self.name == "detokenizer"

    @property
    def default_system(self) -> bool:
        """chat-template: the template adds a default system turn (stackbuild.sim.text)."""
        return self.name == "chat-template"

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
    if name in _COUNTS:
        if not arg.isdigit():
            raise ValueError(f"{name} needs {_COUNTS[name]}")
        return Fault(name, after=int(arg))
    if name == "garbage":
        kind = arg or "repeat"
        if kind not in GARBAGE_KINDS:
            raise ValueError(f"garbage takes one of {', '.join(GARBAGE_KINDS)}")
        return Fault(name, garbage=kind)
    if arg:
        raise ValueError(f"fault {name} takes no argument")
    return Fault(name)
