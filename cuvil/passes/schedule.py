"""schedule: the order the program's steps run in and their priorities (program stage)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..schedule import Buffer, schedule_steps
from .base import ProgramPass
from .registry import register_pass


@register_pass
@dataclass(frozen=True)
class Schedule(ProgramPass):
    """Latency-aware list scheduling: anchors first, then the critical path, then lower peak memory."""
    name: ClassVar[str] = "schedule"
    invalidates: ClassVar[frozenset[str]] = frozenset({"memory-planned"})
    slack: float = 0.1          # steps within this fraction of the longest ready path compete on memory

    def __post_init__(self):
        if not 0 <= self.slack <= 1:
            raise ValueError(f"slack must be a fraction in [0, 1], not {self.slack}")

    def run_program(self, draft) -> dict:
        buffers = [Buffer(draft.hint(nbytes), draft.producer[key], frozenset(draft.readers.get(key, ())))
                   for key, nbytes in draft.arena.values()]
        result = schedule_steps(draft.data_deps(), draft.cost_ns(), buffers, kinds=draft.step_kinds(),
                                anchors_us=draft.anchors_us, slack=self.slack)
        draft.reorder(result.order, result.priorities)
        return result.statistics()
