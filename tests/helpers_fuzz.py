"""How many examples a property test tries.

The inner loop (plain `pytest`) tries a quarter of them; `make test`, which CI runs, sets
STACKBUILD_FUZZ=full and tries them all. The assertions are the same either way: only how far
Hypothesis searches changes.
"""

from __future__ import annotations

import os

FULL = os.environ.get("STACKBUILD_FUZZ", "") == "full"


def examples(full: int) -> int:
    return full if FULL else max(full // 4, 25)
