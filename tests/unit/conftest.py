"""Shared fixtures of the unit tests."""

from __future__ import annotations

from typing import Any

import pytest

from sizing_groundtruth import load_releases


@pytest.fixture
def releases() -> dict[str, Any]:
    """vllm_node_vllm_releases (roles/vllm_node/vars/main/vllm_releases.yml, read once per session): the
    sizing maths reads no files, every caller passes it."""
    return load_releases()
