"""Counts the exchanges ``ferrodist._exchange`` posts, so that a worker can check that a
composed path was really taken (import it before the code under test runs)."""

from __future__ import annotations

from typing import Any

import ferrodist._exchange as exchange

calls = {"exchange": 0}
_composed = exchange._exchange


def _counted(*args: Any, **kwargs: Any) -> Any:
    calls["exchange"] += 1
    return _composed(*args, **kwargs)


exchange._exchange = _counted  # type: ignore[assignment]
