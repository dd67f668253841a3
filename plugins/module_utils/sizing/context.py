"""Sizing: every value a plan resolved (device, parallelism, KV dtype, layout, budget, length), in one object."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .budget import Batch, MemoryBudget
from .inputs import Device, PlanInputs
from .kv_dtype import KVChoice
from .kv_layout import KVLayout, LayoutInputs
from .model import ModelShape
from .parallel import Parallel


@dataclass(frozen=True)
class Sizing:
    """The resolved sizing of one plan; advice, checks, reasons and the command line are read from it."""

    inputs: PlanInputs
    shape: ModelShape
    model_max: int
    device: Device
    par: Parallel
    kv: KVChoice
    batch: Batch
    layout_inputs: LayoutInputs
    layout: KVLayout
    memory: MemoryBudget
    weights: int                 # per GPU (cpu: checkpoint / ranks, reported only)
    available: int               # KV bytes per GPU (cpu: per rank)
    per_block: int               # bytes of one block on the most loaded stage (the null block)
    formula: str                 # the release's "KV cache size: N tokens" formula
    requested_len: int | None    # None: auto
    chosen_len: int
    safe: int                    # largest length whose one request fits (0: none)
    notes: tuple[str, ...]
    stage_weights: tuple[int, ...] = ()     # weights per GPU of each pipeline stage
    stage_available: tuple[int, ...] = ()   # KV bytes per GPU of each pipeline stage (available is the bound's)
    bound: int = 0                          # the stage with the fewest KV blocks (vLLM takes the min over ranks)
    startup: tuple[tuple[str, Any], ...] = ()   # the start-up budget (startup.startup_budget), as items
    kv_cache_blocks: int | None = None      # the KV cache pinned to this many blocks (kv_blocks.py); None: not
    budget_blocks: int = 0                  # with a pin: the blocks the memory budget would hold at most

    @property
    def cuda(self) -> bool:
        return self.device.kind == "cuda"

    @property
    def where(self) -> str:
        return "per GPU" if self.cuda else "per rank"

    @property
    def len_ok(self) -> bool:
        return 0 < self.chosen_len <= self.safe and self.chosen_len <= self.model_max

    @property
    def needed(self) -> int:
        return self.layout.needed_bytes(self.chosen_len) if self.chosen_len > 0 else 0

    @property
    def per_stage(self) -> tuple[int, ...] | int:
        """KV bytes per stage for the layout's maths (one number when there is no per-stage split)."""
        return self.stage_available if self.stage_available else self.available

    @property
    def sized(self) -> bool:
        """KV memory and a length to size a pool for."""
        return self.available > 0 and self.chosen_len > 0

    @property
    def tokens(self) -> int:
        return self.layout.tokens(self.per_stage, self.chosen_len, self.formula) if self.sized else 0

    @property
    def concurrency(self) -> float:
        return self.layout.max_concurrency(self.per_stage, self.chosen_len) if self.sized else 0.0
