#!/usr/bin/python
"""Documentation of the action plugin plugins/action/model_download.py (the code runs on the controller)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: model_download
short_description: Download a Hugging Face model to the node with the hf CLI, metadata first, verified, resumable
description:
  - The model_download role's work, one step per call. V(metadata) checks the inputs and the hf CLI, creates
    the directories, moves the layout before C(revisions/) into its commit's directory, resolves a branch or tag
    to a commit once (C(hf models info), C(hf models ls)) and records it with the file list, hard-links the files
    whose sha256 a verified revision already holds, fetches the small files and reads C(config.json), the index
    and C(hf_quant_config.json).
  - V(all) does the same, then checks the free space against what is missing plus a margin (refused with the
    numbers before any byte is fetched), runs C(hf download) in the background and waits with one progress line
    (bytes, percent, rate, ETA) every C(progress_interval) seconds, bounded by C(timeout_seconds) + 60 s, checks
    hf's exit status, its offline fallback and every file's size, then C(hf cache verify) (with C(repair), the
    corrupted files are fetched again once).
  - V(seal) hashes the small files (model_config's originals) and writes the completion marker with every file's
    sha256.
  - The node's part is M(vllm_node.vllm_node.model_download_node) and M(vllm_node.vllm_node.model_download_link);
    the decisions are C(plugins/module_utils/model_download/files.py).
options:
  step:
    description: The step.
    type: str
    required: true
    choices: [metadata, all, seal]
  request:
    description:
      - Every C(model_download_*) input but the token, keyed without the prefix (the role's
        C(__model_download_request)).
    type: dict
    required: true
  token:
    description: Hub token; written to a 0600 file only while hf runs.
    type: str
    default: ""
  handed_over:
    description: The pass right after a metadata-only pass of the same request keeps that pass's commit.
    type: bool
    default: false
  check_mode:
    description: Run as in check mode although the play's check mode is off (a play that says so with a variable).
    type: bool
    default: false
  commit:
    description: The revision to seal (V(seal)).
    type: str
    default: ""
  files:
    description: Its files as the V(all) step returned them (V(seal)).
    type: list
    elements: dict
    default: []
attributes:
  check_mode:
    support: full
    description: Reads the node and says what a real run would do; resolves nothing, fetches nothing.
  diff_mode:
    support: partial
    description: The record and the completion marker it writes.
author: vllm-node
"""

EXAMPLES = r"""
- name: Resolve, fetch and verify the model
  vllm_node.vllm_node.model_download:
    step: all
    request: "{{ __model_download_request }}"
    token: "{{ model_download_token }}"
  register: downloaded
"""

RETURN = r"""
facts:
  description: The facts the role publishes (model_download_commit, model_download_dir, model_download_config, ...).
  type: dict
  returned: always
seal:
  description: The revision is downloaded and verified but not sealed yet (run the V(seal) step).
  type: bool
  returned: always
messages:
  description: The lines the step printed (links, disk check, verification).
  type: list
  elements: str
  returned: always
"""
