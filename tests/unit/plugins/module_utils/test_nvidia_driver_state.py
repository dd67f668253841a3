"""'Is the wanted NVIDIA driver installed and loaded' (plugins/module_utils/nvidia_driver_state.py)."""
from __future__ import annotations

from typing import Any

import pytest

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import nvidia_driver_state as nds

WANTED = ["nvidia-driver-pinning-580", "libnvidia-compute-580", "nvidia-dkms-580-open", "nvidia-utils-580"]
KMOD = "nvidia-dkms-580-open"


def packages(version: str = "580.95.05-0ubuntu1", **override: str | None) -> dict[str, list[dict[str, Any]]]:
    """ansible_facts.packages as package_facts (apt) returns it."""
    names = dict.fromkeys(WANTED + ["linux-headers-6.8.0-86-generic"], version) | override
    return {name: [{"name": name, "version": v, "arch": "amd64", "source": "apt"}]
            for name, v in names.items() if v is not None}


def state(pkgs: dict[str, Any] | None = None, loaded: str = "580.95.05", glob: str = "580.*",
          license_: str = "Dual MIT/GPL", modules: str = "open") -> dict[str, Any]:
    return nds.driver_state(packages() if pkgs is None else pkgs, WANTED, KMOD, loaded, glob, license_, modules)


def test_the_wanted_driver_installed_and_loaded() -> None:
    result = state()
    assert result == {"satisfied": True, "missing": [], "kmod_version": "580.95.05", "reasons": []}
    assert state(glob="580.95.05-*")["satisfied"], "an exact pinned version"
    assert state(packages("1:580.95.05-1"))["satisfied"], "an epoch does not count"


@pytest.mark.parametrize(("kwargs", "reason"), [
    ({"pkgs": packages(**{"nvidia-utils-580": None})}, "not installed: nvidia-utils-580"),
    ({"loaded": ""}, "no NVIDIA module loaded"),
    ({"loaded": "580.82.07"}, "loaded 580.82.07 but nvidia-dkms-580-open is 580.95.05"),
    ({"pkgs": packages(**{KMOD: None})}, "but nvidia-dkms-580-open is not installed"),
    ({"glob": "590.*"}, "is not the wanted 590.*"),
    ({"glob": "580.82.07-*"}, "is not the wanted 580.82.07-*"),
    ({"license_": "NVIDIA"}, "license 'NVIDIA', not the open flavour"),
    ({"modules": "proprietary"}, "not the proprietary flavour"),
])
def test_each_difference_is_named(kwargs: dict[str, Any], reason: str) -> None:
    result = state(**kwargs)
    assert not result["satisfied"]
    assert any(reason in r for r in result["reasons"]), result["reasons"]


def test_dots_in_the_glob_are_literal() -> None:
    """The old regex-from-glob conversion had to escape dots; fnmatch never treats them as wildcards."""
    assert nds.version_matches_glob("580.95.05-1", "580.*")
    assert not nds.version_matches_glob("580x95-1", "580.*")
    assert not nds.version_matches_glob("", "*")


def test_installed_versions_accepts_plain_maps_and_refuses_bad_flavours() -> None:
    assert nds.installed_versions({"a": "1.0-1", "b": [{"version": "2"}, {"version": "3"}], "c": []}) == {
        "a": "1.0-1", "b": "2"}
    with pytest.raises(ValueError, match="open or proprietary"):
        state(modules="closed")
