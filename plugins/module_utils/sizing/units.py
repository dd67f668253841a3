"""Byte units, ceiling division, the one byte formatter, and the coercion of Ansible knob values."""

from __future__ import annotations

from typing import Any

from .errors import SizingError

GiB = 1 << 30
MiB = 1 << 20


def cdiv(a: int, b: int) -> int:
    """Ceiling division for non-negative ints (vLLM's cdiv)."""
    return -(-a // b)


def format_bytes(num_bytes: float) -> str:
    """Human size: GiB with 2 decimals (MiB below 0.1 GiB, so a block never reads as 0.00 GiB)."""
    if 0 < abs(num_bytes) < GiB / 10:
        return f"{num_bytes / MiB:.2f} MiB"
    return f"{num_bytes / GiB:.2f} GiB"


def to_int(name: str, value: Any) -> int:
    """A whole number from an int, a float or a numeric string; SizingError naming the knob otherwise."""
    if isinstance(value, bool):
        raise SizingError(f"{name} must be an integer, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise SizingError(f"{name} must be an integer or 'auto', got {value!r}") from None
    if number != int(number):
        raise SizingError(f"{name} must be a whole number, got {value!r}")
    return int(number)


def is_auto(value: Any) -> bool:
    """'auto', '', '-1', -1 and None all mean: let the plan choose."""
    return value is None or (isinstance(value, str) and value.strip().lower() in ("auto", "", "-1")) or value == -1


def plain(value: Any) -> Any:
    """Ansible's own str/dict/list subclasses (and lazy containers) as plain Python values, before the maths sees them
    (the filters and the vllm_plan action both hand their arguments through this)."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, bool) or value is None:
        return value
    for kind in (int, float, str):
        if isinstance(value, kind):
            return kind(value)
    return value
