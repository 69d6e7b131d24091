"""Simulator profiles, calibrated to the users' own measurements.

Source of the figures: /work/shared/data/seed-results.json ("sweep", from the
users' notes seeds/004_f0daea3947b3a44f.txt, CUDA 13.0.1, 8x RTX PRO 6000
Blackwell, TP=8), output tok/s at concurrency C:

  baseline          C=1 92.7   C=30 689.4   C=250 718.1   peak ~773
  eagle3-topk1-v2   C=1 86.8   C=30 759.3   C=250 754.4   peak ~775, and
                    "matches or beats baseline at every C from 2 to 250" (their words).
                    Its peak (~775) is placed at C=80 (an assumption: the notes give
                    the value, not where).
  eagle3-topk4-v1   plateau ~353 (no per-C figures). Its C=1 anchor (85.0) is an
                    assumption: the sweep in seeds/004 gives no C=1 figure for it,
                    but its conclusion is that baseline wins at C=1 against both
                    speculative configurations, so topk4-v1 sits below baseline
                    (92.7) and near topk1-v2 (86.8). The 96.1 single-stream figure
                    in seed-results is from an earlier session with another setup
                    (fusion + symm mem), not from this sweep. The C=30 anchor (345)
                    is our reading of "plateau" (slightly below the C=250 value).
                    Both are assumptions, named here.

Timing model (continuous batching, one decode step for the whole running batch):
  step_ms(B) = t0 + a*B + b*B^2      B = running requests, capped at max_running
  tokens per request per step = 1 + accepted drafts (speculative profiles)
so steady-state output tok/s at C clients is B*E[accept]/step_ms(B), B = min(C, cap).
The three coefficients are solved from three anchor points per profile; the
quadratic term is what makes throughput saturate (and baseline peak near
C~97 at ~767 tok/s, as the users saw ~773).

Spec v2 overlaps the draft chain of the next step with the verify of this one, so
its step takes the longer of the two: step_ms(B) = max(floor, q(B)). The draft
chain (two sequential small forward passes, each all-reduce bound over PCIe) is
what a single request waits on, so the C=1 figure sets the floor and the
batch-dependent verify q(B) is fitted through the other three anchors. A plain
quadratic through C=1, 30 and 250 cannot hold topk1-v2 above baseline at C=2
while it is 6% below at C=1, which the users measured.

The users ran the speculative configurations with --max-running-requests 256
(as stacks/_blackwell.yaml does); the anchors are solved at that cap. Without
the flag sglang 0.5.23 caps speculative decoding at 48 running requests, and so
does the simulator (`--max-running-requests` overrides it, as in sglang).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

SOURCE = "/work/shared/data/seed-results.json (users' sweep, seeds/004_f0daea3947b3a44f.txt)"


@dataclass(frozen=True)
class SimProfile:
    name: str
    description: str
    # (concurrency, output tok/s) anchors the step-time curve is solved from
    anchors: tuple[tuple[int, float], tuple[int, float], tuple[int, float]]
    # sglang's cap on running requests when --max-running-requests is not given
    max_running: int
    # the --max-running-requests the anchors were measured with
    anchor_max_running: int
    # speculative decoding: draft steps and per-draft acceptance probability; the
    # accepted length of a step is 1 + the run of accepted drafts (geometric, capped)
    spec_steps: int = 0
    accept_p: float = 0.0
    topk: int = 1
    # spec v2 overlap: the C=1 output tok/s, which sets the draft-chain floor of a step
    overlap_c1: float | None = None
    # prefill: fixed + per input token (whole batch), decode pauses meanwhile
    prefill_base_ms: float = 8.0
    prefill_ms_per_token: float = 0.02
    # noise: per-step lognormal jitter and a slow drift that changes every drift_every_s
    step_jitter: float = 0.05
    drift: float = 0.015
    drift_every_s: float = 2.0
    coeffs: tuple[float, float, float] = field(init=False)
    floor_ms: float = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "coeffs", _fit(self))
        floor = 0.0 if self.overlap_c1 is None else self.mean_accept * 1000.0 / self.overlap_c1
        object.__setattr__(self, "floor_ms", floor)

    def with_max_running(self, cap: int | None) -> SimProfile:
        """This profile under `--max-running-requests cap` (None: sglang's default)."""
        return self if cap is None else replace(self, max_running=cap)

    def as_measured(self) -> SimProfile:
        """This profile under the cap the users' anchors were measured with."""
        return self.with_max_running(self.anchor_max_running)

    @property
    def mean_accept(self) -> float:
        return expected_accept(self.spec_steps, self.accept_p)

    @property
    def speculative(self) -> bool:
        return self.spec_steps > 0


def expected_accept(steps: int, p: float) -> float:
    """E[1 + accepted drafts] when each of `steps` drafts is accepted with p until one fails."""
    return sum(p**k for k in range(steps + 1))


def _fit(profile: SimProfile) -> tuple[float, float, float]:
    """Solve t0 + a*B + b*B^2 = B*E[accept]*1000/tok_s through the three anchors."""
    rows: list[list[float]] = []
    for conc, tok_s in profile.anchors:
        batch = min(conc, profile.anchor_max_running)
        step_ms = batch * profile.mean_accept * 1000.0 / tok_s
        rows.append([1.0, float(batch), float(batch * batch), step_ms])
    return _solve3(rows)


def _solve3(m: list[list[float]]) -> tuple[float, float, float]:
    # Gaussian elimination with partial pivoting on a 3x4 augmented matrix.
    for col in range(3):
        piv = max(range(col, 3), key=lambda r: abs(m[r][col]))
        m[col], m[piv] = m[piv], m[col]
        for r in range(3):
            if r != col:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col], strict=True)]
    return (m[0][3] / m[0][0], m[1][3] / m[1][1], m[2][3] / m[2][2])


PROFILES: dict[str, SimProfile] = {
    "baseline": SimProfile(
        name="baseline",
        description="no speculation, CUDA 13, cuda-graph max bs 128 (users' sweep)",
        anchors=((1, 92.7), (30, 689.4), (250, 718.1)),
        # no speculation: KV capacity, not a fixed cap, bounds it
        max_running=1024,
        anchor_max_running=1024,
    ),
    "eagle3-topk1-v2": SimProfile(
        name="eagle3-topk1-v2",
        description="EAGLE-3, 2 draft steps, topk 1, spec v2 overlap (users' sweep)",
        anchors=((30, 759.3), (80, 775.0), (250, 754.4)),
        overlap_c1=86.8,
        max_running=48,
        anchor_max_running=256,
        spec_steps=2,
        accept_p=0.7,
        topk=1,
    ),
    "eagle3-topk4-v1": SimProfile(
        name="eagle3-topk4-v1",
        description="EAGLE-3, 2 draft steps, topk 4, spec v1 (users' plateau ~353)",
        anchors=((1, 85.0), (30, 345.0), (250, 353.0)),
        max_running=48,
        anchor_max_running=256,
        spec_steps=2,
        accept_p=0.8,
        topk=4,
    ),
}
