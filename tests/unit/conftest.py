"""Shared fixtures of the unit tests."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from sizing_groundtruth import load_releases

# Hypothesis's timing checks measure the machine, not the code: CI's two cores run the unit tests beside lint and the
# image builds, and a property test's input generation took 1.03 s at load 25 and failed its health check. Every
# property test runs without a deadline and without the too-slow check; a test's own @settings still set the rest.
settings.register_profile("shared-cores", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("shared-cores")


@pytest.fixture
def releases() -> dict[str, Any]:
    """vllm_node_vllm_releases (roles/vllm_node/vars/main/vllm_releases.yml, read once per session): the
    sizing maths reads no files, every caller passes it."""
    return load_releases()
