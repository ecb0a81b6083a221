"""plan-memory: place every intermediate buffer of the program in one arena (program stage)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from ..memory_plan import ALIGN, plan_memory
from .base import ProgramPass
from .registry import register_pass


@register_pass
@dataclass(frozen=True)
class PlanMemory(ProgramPass):
    """Lifetimes over the schedule, best-fit offsets in one arena, in-place reuse (cuvil/memory_plan.py)."""
    name: ClassVar[str] = "plan-memory"
    provides: ClassVar[frozenset[str]] = frozenset({"memory-planned"})
    align: int = ALIGN
    inplace: bool = True
    strategy: Literal["best-fit", "naive"] = "best-fit"

    def __post_init__(self):
        if self.align < 1 or self.align & (self.align - 1):
            raise ValueError(f"align must be a power of two, not {self.align}")

    def run_program(self, draft) -> dict:
        draft.plan = plan_memory(draft.buffer_uses(), draft.hint, self.align, inplace=self.inplace,
                                 strategy=self.strategy)
        return draft.plan.statistics(draft.hint)
