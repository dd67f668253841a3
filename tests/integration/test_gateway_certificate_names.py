"""The names the gateway role puts in its demo certificate (roles/gateway/vars/main.yml), rendered by the real
ansible-playbook: the host's addresses come from Ansible's facts, or from `hostname --all-ip-addresses` when Ansible
gathered none (a host without iproute2: `make demo`'s printed curl to the container's address was refused by TLS)."""

from __future__ import annotations

import json
from pathlib import Path

from test_plan_playbook import ROOT

from harness import playbook

PLAY = """
- hosts: localhost
  gather_facts: false
  connection: local
  vars:
    gateway_tls_subject_alt_names: []
  tasks:
    - ansible.builtin.include_vars: {file: %s}
    - ansible.builtin.set_fact: {ansible_facts: "{{ ansible_facts | combine(facts) }}"}
    - ansible.builtin.copy: {content: "{{ __gateway_subject_alt_names | to_json }}", dest: %s, mode: "0600"}
"""


def names(tmp_path: Path, facts: dict, hostname_output: str | None) -> list[str]:
    """__gateway_subject_alt_names for these facts and this `hostname --all-ip-addresses` output (None: skipped)."""
    out = tmp_path / "names.json"
    play = tmp_path / "play.yml"
    play.write_text(PLAY % (ROOT / "roles" / "gateway" / "vars" / "main.yml", out))
    registered = {"skipped": True} if hostname_output is None else {"stdout": hostname_output}
    extra = {"facts": facts, "__gateway_hostname_addresses": registered}
    run = playbook.run(play, "-e", json.dumps(extra), inventory="localhost,", timeout=120)
    assert run.rc == 0, run.output
    return json.loads(out.read_text())


def test_the_facts_addresses_are_named(tmp_path: Path) -> None:
    got = names(tmp_path, {"all_ipv4_addresses": ["10.0.0.5"], "hostname": "gw", "fqdn": "gw.example"}, None)
    assert "IP:10.0.0.5" in got and "IP:127.0.0.1" in got and "DNS:gw.example" in got


def test_without_facts_the_hostname_addresses_are_named_ipv6_left_out(tmp_path: Path) -> None:
    got = names(tmp_path, {"hostname": "gw"}, "172.17.0.2 10.9.8.7 fd00::2 ")
    assert {"IP:172.17.0.2", "IP:10.9.8.7", "IP:127.0.0.1"} <= set(got)
    assert not [name for name in got if name.startswith("IP:") and ":" in name[3:]], got


def test_without_facts_or_output_only_loopback(tmp_path: Path) -> None:
    got = names(tmp_path, {}, "")
    assert [name for name in got if name.startswith("IP:")] == ["IP:127.0.0.1"]
