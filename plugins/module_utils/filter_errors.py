"""What the collection's filters raise for bad input: Ansible's AnsibleFilterError, naming the filter, so a play
fails with the parser's message instead of a Python traceback. Plain Python use (tests) without Ansible gets
ValueError."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # plain Python use (tests) without Ansible installed
    AnsibleFilterError = ValueError


def reports_bad_input(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a wrong input's ValueError/TypeError/KeyError into AnsibleFilterError, naming the filter."""
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except (ValueError, TypeError, KeyError) as err:
            raise AnsibleFilterError(f"{func.__name__}: {err}") from err
    return wrapper
