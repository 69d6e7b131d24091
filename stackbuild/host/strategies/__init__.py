"""The deploy strategies, one module each, implementing host/strategy.py's `Strategy` (listed by name
in spec/stack.py's STRATEGY_MODULES)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # mypy checks that each module implements the protocol
    from stackbuild.host.strategies import side_by_side, swap, take_over
    from stackbuild.host.strategy import Strategy

    _IMPLEMENTED: tuple[Strategy, ...] = (swap, side_by_side, take_over)
