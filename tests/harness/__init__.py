"""The one test harness of the scenarios (molecule/*/tests) and the integration tests (tests/integration).

Importable as `harness` (pyproject.toml's pytest pythonpath names tests/; molecule's testinfra verifier runs pytest
under the same rootdir, so a scenario's tests import it as the integration tests do):

- `harness.project`: the repository root, artifacts/, the molecule inventory and a testinfra host by name;
- `harness.playbook`: ansible-playbook with the project's environment and a kept log, and its output read back
  (PLAY RECAP counters, changed tasks, a task's results);
- `harness.figures`: a step's measured figures kept in one JSON file per scenario (the reports and docs read them);
- `harness.unit`: a systemd unit's witness (MainPID, invocation id, timestamps) and its restarts counted from the
  journal;
- `harness.api`: a request sent from a node with curl, an HTTPS request or stream through the gateway, one chat
  completion checked;
- `harness.clients`: a bounded client loop and its accounting;
- `harness.backends`: stand-in vLLM servers on loopback that answer with their name (the gateway's routing tests);
- `harness.node`: small readers of a converged node (its API key, its listening sockets);
- `harness.venv`: checks of a vllm_env venv on a node.

tests/unit/harness/test_harness.py fails when a helper is defined in two test modules: put it here instead.
"""
