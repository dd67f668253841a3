"""The one exception the sizing maths raises for input it cannot plan."""

from __future__ import annotations

from collections.abc import Iterable


class SizingError(ValueError):
    """Bad input for the sizing maths: the message names the problem and the valid choices."""


def refuse_unknown_keywords(given: Iterable[str], known: Iterable[str]) -> None:
    """Raise SizingError naming every keyword argument not in `known` (a typo must not be silently ignored)."""
    known_set = set(known)
    unknown = sorted(set(given) - known_set)
    if unknown:
        raise SizingError(f"unknown keyword argument(s) {', '.join(unknown)}; known: {', '.join(sorted(known_set))}")
