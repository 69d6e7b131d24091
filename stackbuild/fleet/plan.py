"""The pure core of a rollout: waves, what a wave's results decide, what goes back, outliers.

No I/O here; stackbuild.fleet.rollout runs these decisions against the hosts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from stackbuild.spec.fleet import WaveStep


def _target(step: WaveStep, n: int) -> int:
    if isinstance(step, int):
        return min(step, n)
    return min(n, max(1, math.ceil(int(step.rstrip("%")) * n / 100)))


def plan_waves(hosts: Sequence[str], steps: Sequence[WaveStep], max_parallel: int | None = None) -> list[list[str]]:
    """Hosts in inventory order cut into waves. The first wave is always the canary alone.

    `steps` are cumulative targets (1, "25%", "100%"); a step that adds no host is
    dropped and the last wave always reaches every host. `max_parallel` splits
    every later wave into chunks of at most that many hosts.
    """
    n = len(hosts)
    if n == 0:
        return []
    targets = [1]
    for step in steps:
        t = _target(step, n)
        if t > targets[-1]:
            targets.append(t)
    if targets[-1] < n:
        targets.append(n)
    waves = [list(hosts[a:b]) for a, b in zip([0, *targets], targets, strict=False)]
    if max_parallel:
        waves = [waves[0]] + [w[i : i + max_parallel] for w in waves[1:] for i in range(0, len(w), max_parallel)]
    return waves


def emptying_waves(waves: Sequence[Sequence[str]], hosts: Sequence[str]) -> list[int]:
    """The waves that take every host of the pool at once (a rollout drains each host of a wave out of
    the gateway for its deploy): an outage for the clients. A 1-host fleet's canary is one."""
    everyone = set(hosts)
    return [i for i, w in enumerate(waves) if everyone and set(w) >= everyone]


def remaining(waves: Sequence[Sequence[str]], done: set[str]) -> list[tuple[int, list[str]]]:
    """(wave number, hosts still to deploy) for every wave that has any: where a re-run resumes."""
    out = []
    for i, wave in enumerate(waves):
        left = [h for h in wave if h not in done]
        if left:
            out.append((i, left))
    return out


# Per-host outcomes of a deploy as the single-host flow reports them.
PASSED = "promoted"


@dataclass(frozen=True)
class WaveDecision:
    go_on: bool
    failed: tuple[str, ...]  # hosts whose deploy or soak did not pass
    revert: tuple[str, ...]  # hosts now on the candidate that must go back to their incumbent
    why: str


def decide_wave(
    outcomes: Mapping[str, str],
    earlier: Sequence[str],
    policy: str,
    on_candidate: Sequence[str] = (PASSED,),
) -> WaveDecision:
    """After every host of a wave reported: go on only if all were promoted.

    On a stop the wave's hosts still on the candidate (outcomes in `on_candidate`:
    promoted, or promoted and then failed their soak) go back; its failed deploys
    were already put back by their own deploy; `rollback_all` also takes back `earlier` (the hosts
    promoted by previous waves, canary included); `halt` leaves them.
    """
    failed = tuple(h for h, o in outcomes.items() if o != PASSED)
    if not failed:
        return WaveDecision(True, (), (), f"all {len(outcomes)} host(s) promoted")
    wave_back = tuple(h for h, o in outcomes.items() if o in on_candidate)
    back = (*wave_back, *earlier) if policy == "rollback_all" else wave_back
    what = (
        "every host promoted so far goes back to its incumbent"
        if policy == "rollback_all"
        else "earlier waves stay on the candidate"
    )
    return WaveDecision(False, failed, back, f"{len(failed)} host(s) failed ({', '.join(failed)}); "
                        f"on_failure={policy}: the wave goes back, {what}")


def outliers(
    reference: Mapping[int, float],
    per_host: Mapping[str, Mapping[int, float]],
    tolerance: float,
    noise: Mapping[str, Mapping[int, float]] | None = None,
) -> dict[str, str]:
    """Hosts whose median tok/s at some level is further from the reference host's (the canary)
    than the noise both gates measured there, and than `tolerance`: host -> why.

    `noise[host][c]` is the relative spread of that host's runs at level c (the
    reference's own under the key ""); a level without it counts as noiseless.
    """
    noise = noise or {}
    flagged: dict[str, str] = {}
    for host, levels in per_host.items():
        for c, ref in sorted(reference.items()):
            got = levels.get(c)
            if got is None or ref <= 0:
                continue
            ratio = got / ref
            allowed = max(tolerance, noise.get("", {}).get(c, 0.0) + noise.get(host, {}).get(c, 0.0))
            if abs(ratio - 1) > allowed:
                flagged[host] = (f"C={c}: {got:.1f} tok/s is {ratio:.2f}x the canary's {ref:.1f} "
                                 f"(allowed {allowed:.0%}: class tolerance or the runs' own spread)")
                break
    return flagged


def spread(values: Sequence[float]) -> float:
    """Relative spread of a level's runs: (max - min) / median; 0 for fewer than two."""
    if len(values) < 2:
        return 0.0
    v = sorted(values)
    mid = v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2
    return (v[-1] - v[0]) / mid if mid > 0 else 0.0


def host_class(gpus: object, gpu_model: str | None, driver: str | None) -> str:
    """Hosts are compared within a class: GPU count x model and driver."""
    if gpus == "none":
        return "no GPU"
    return f"{gpus}x {gpu_model or 'GPU'}" + (f", driver {driver}" if driver else "")
