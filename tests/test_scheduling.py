"""The order `make test` hands its scopes to the xdist workers in (tests/conftest.py, apart)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from conftest import HELD, apart

UNIT = SimpleNamespace()
SIMS = SimpleNamespace(PER_TEST=True)
DEMOS = SimpleNamespace(PER_TEST=True, APART=True)


def _items(*spec: tuple[str, Any]) -> list[Any]:
    return [SimpleNamespace(name=name, module=module) for name, module in spec]


def _names(items: list[Any]) -> list[str]:
    return [i.name for i in items]


def test_long_tests_lead_with_two_short_ones_between_each_two() -> None:
    """A worker holds up to three pending tests (HELD): the one that takes d1 holds s1 and s2."""
    items = _items(("u1", UNIT), ("s1", SIMS), ("d1", DEMOS), ("d2", DEMOS), ("s2", SIMS), ("s3", SIMS),
                   ("d3", DEMOS), ("s4", SIMS), ("s5", SIMS), ("u2", UNIT))
    assert HELD == 3
    assert _names(apart(items)) == ["d1", "s1", "s2", "d2", "s3", "s4", "d3", "u1", "s5", "u2"]


def test_with_too_few_short_tests_the_long_ones_still_lead() -> None:
    assert _names(apart(_items(("u1", UNIT), ("d1", DEMOS), ("s1", SIMS), ("d2", DEMOS)))) == ["d1", "s1", "d2", "u1"]
    assert _names(apart(_items(("u1", UNIT), ("d1", DEMOS)))) == ["d1", "u1"]
