"""The order `make test` hands its scopes to the xdist workers in (tests/conftest.py, apart)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from conftest import apart

UNIT = SimpleNamespace()
SIMS = SimpleNamespace(PER_TEST=True)
DEMOS = SimpleNamespace(PER_TEST=True, APART=True)


def _items(*spec: tuple[str, Any]) -> list[Any]:
    return [SimpleNamespace(name=name, module=module) for name, module in spec]


def _names(items: list[Any]) -> list[str]:
    return [i.name for i in items]


def test_long_tests_lead_with_a_short_one_between_each_two() -> None:
    items = _items(("u1", UNIT), ("s1", SIMS), ("d1", DEMOS), ("d2", DEMOS), ("s2", SIMS), ("d3", DEMOS), ("u2", UNIT))
    assert _names(apart(items)) == ["d1", "s1", "d2", "s2", "d3", "u1", "u2"]


def test_the_order_stays_when_there_is_nothing_to_spread() -> None:
    one = _items(("u1", UNIT), ("d1", DEMOS), ("s1", SIMS))
    assert _names(apart(one)) == ["u1", "d1", "s1"]
    no_short = _items(("d1", DEMOS), ("u1", UNIT), ("d2", DEMOS))
    assert _names(apart(no_short)) == ["d1", "u1", "d2"]
