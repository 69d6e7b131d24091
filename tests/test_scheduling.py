"""How `make test` hands its scopes to the xdist workers (tests/helpers_xdist.py): the order of the
queue, and when a worker gets its next scope."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from helpers_xdist import HELD, LastTestScheduling, apart, scheduled
from xdist.scheduler import LoadGroupScheduling

UNIT = SimpleNamespace()
SIMS = SimpleNamespace(PER_TEST=True)
DEMOS = SimpleNamespace(PER_TEST=True, APART=True)


def _items(*spec: tuple[str, Any]) -> list[Any]:
    return [SimpleNamespace(name=name, module=module) for name, module in spec]


def _names(items: list[Any]) -> list[str]:
    return [i.name for i in items]


def test_long_tests_lead_with_a_short_one_between_each_two() -> None:
    """A worker holds up to two tests (HELD): the one that takes d1 holds s1 too, and d2 goes elsewhere."""
    items = _items(("u1", UNIT), ("s1", SIMS), ("d1", DEMOS), ("d2", DEMOS), ("s2", SIMS), ("s3", SIMS),
                   ("d3", DEMOS), ("s4", SIMS), ("u2", UNIT))
    assert HELD == 2
    assert _names(apart(items)) == ["d1", "s1", "d2", "s2", "d3", "u1", "s3", "s4", "u2"]


def test_with_too_few_short_tests_the_long_ones_still_lead() -> None:
    assert _names(apart(_items(("u1", UNIT), ("d1", DEMOS), ("d2", DEMOS)))) == ["d1", "d2", "u1"]
    assert _names(apart(_items(("u1", UNIT), ("d1", DEMOS)))) == ["d1", "u1"]


# a module of three tests kept on one worker (xdist_group "fleet"), then three one-test scopes
COLLECTION = ["tests/f.py::t1@fleet", "tests/f.py::t2@fleet", "tests/f.py::t3@fleet",
              "tests/d.py::demo", "tests/s.py::s1", "tests/s.py::s2"]


@pytest.mark.parametrize(("kind", "after_first"), [
    (LastTestScheduling, [[0, 1, 2]]),  # two of its tests still ahead: nothing more yet
    (LoadGroupScheduling, [[0, 1, 2], [3]]),  # xdist's own rule: the demo, queued behind t2 and t3
])
def test_a_worker_gets_its_next_scope_only_on_its_last_test(
        kind: type[LoadGroupScheduling], after_first: list[list[int]]) -> None:
    sched, (w,) = scheduled(kind, COLLECTION, 1)
    assert w.sent == [[0, 1, 2]]
    sched.mark_test_complete(w, 0)
    assert w.sent == after_first
    sched.mark_test_complete(w, 1)
    assert w.sent[:2] == [[0, 1, 2], [3]]  # t3 runs only with the next test in hand: the demo now


def test_one_test_scopes_go_two_at_a_time() -> None:
    """A worker given a one-test scope is given a second at once (it cannot run the first without it)."""
    _, (w0, w1) = scheduled(LastTestScheduling, COLLECTION, 2)
    assert (w0.sent, w1.sent) == ([[0, 1, 2]], [[3], [4]])
