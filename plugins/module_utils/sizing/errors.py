"""The one exception the sizing maths raises for input it cannot plan."""

from __future__ import annotations


class SizingError(ValueError):
    """Bad input for the sizing maths: the message names the problem and the valid choices."""
