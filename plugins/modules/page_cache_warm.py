#!/usr/bin/python
"""Ansible module: read a model's weights into the page cache before a restart, bounded by available memory."""

from __future__ import annotations

DOCUMENTATION = r"""
module: page_cache_warm
short_description: Read a model's weight files into the page cache, bounded by the memory available now
description:
  - Lists the weight files under O(path) (C(.safetensors), C(.bin), C(.pt), C(.pth), C(.gguf); each real file once)
    and, when their size fits in O(memory_fraction) of C(MemAvailable), asks the kernel to cache them
    (O(mode)=C(willneed), posix_fadvise WILLNEED, the kernel reading ahead while the play goes on) or reads them once
    (O(mode)=C(read)). Larger checkpoints are skipped with the reason (their first shards would be evicted by the
    last before vLLM reads them).
  - playbooks/rollout.yml runs it while a node drains, so its restart reads the weights from memory.
  - Reports how many of the files' bytes were in the page cache before and after (mincore).
  - Changes no file; C(changed) is always false (the page cache is not state a play manages). In check mode it
    decides and measures only.
options:
  path:
    description: The model revision's directory (a path that does not exist yet gives no files).
    type: path
    required: true
  memory_fraction:
    description: Share of C(MemAvailable) the weights may take in the page cache.
    type: float
    default: 0.5
  mode:
    description: C(willneed) (asynchronous read-ahead) or C(read) (a synchronous streaming read).
    type: str
    choices: [willneed, read]
    default: willneed
attributes:
  check_mode:
    support: full
    description: Decides and measures residency only; nothing is read.
  diff_mode:
    support: none
    description: Nothing to diff.
author: vllm-node
"""

EXAMPLES = r"""
- name: Read the served weights into the page cache while the node drains
  vllm_node.vllm_node.page_cache_warm:
    path: /srv/vllm/models/org/model/revisions/0123abcd
    memory_fraction: 0.5
  register: page_cache
"""

RETURN = r"""
warmed:
  description: Whether the files were advised or read (false when skipped, in check mode or with no files).
  type: bool
  returned: success
reason:
  description: Why not, when not warmed ("" otherwise).
  type: str
  returned: success
files:
  description: How many weight files.
  type: int
  returned: success
bytes:
  description: Their size in bytes.
  type: int
  returned: success
budget_bytes:
  description: O(memory_fraction) of C(MemAvailable) at the time.
  type: int
  returned: success
mem_available_bytes:
  description: C(MemAvailable) from /proc/meminfo at the time.
  type: int
  returned: success
resident_bytes_before:
  description: Bytes of the files in the page cache before (null when mincore could not tell).
  type: int
  returned: success
resident_bytes_after:
  description: Bytes in the page cache after (with C(willneed), what the kernel had read by the time it returned).
  type: int
  returned: success
seconds:
  description: Seconds the advice or the read took.
  type: float
  returned: success
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import page_cache


def main() -> None:
    """Decide from the files and MemAvailable, then advise or read them (not in check mode)."""
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "memory_fraction": {"type": "float", "default": 0.5},
            "mode": {"type": "str", "choices": ["willneed", "read"], "default": "willneed"},
        },
        supports_check_mode=True,
    )
    root, fraction, mode = module.params["path"], module.params["memory_fraction"], module.params["mode"]
    if not 0 < fraction <= 1:
        module.fail_json(msg=f"memory_fraction is {fraction}: give a share of the available memory in (0, 1], "
                             "e.g. 0.5")
    with open("/proc/meminfo", encoding="ascii") as handle:
        available = page_cache.mem_available(handle.read())
    files = page_cache.model_files(root)
    decision = page_cache.decide(sum(size for _path, size in files), available, fraction)
    done = None
    if decision.warm and not module.check_mode:
        done = page_cache.warm(files, page_cache.advise if mode == "willneed" else page_cache.stream)
    module.exit_json(changed=False, **page_cache.report(root, decision, files, done, available, mode))


if __name__ == "__main__":
    main()
