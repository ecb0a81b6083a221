"""The memory panel: the arena plan. Buffer lifetimes over the schedule's steps (a bar per buffer
from the step that writes it to the last that reads it), the arena's packing (offset against step,
a rectangle per buffer), and the arena against the naive sum and the peak of live bytes. Picking a
buffer or a step marks it in both pictures and says what it is."""
from __future__ import annotations

import ipywidgets as W

from cuvil.report_html import (buffer_details_html, fmt_bytes, memory_packing_svg, memory_summary_html,
                               memory_timeline_svg, step_count, step_details_html)

from . import Panel, register_panel


@register_panel
class MemoryPanel(Panel):
    name, title, order = "memory", "Memory", 24

    @classmethod
    def available(cls, run) -> bool:
        return bool(run.report.memory.get("buffers"))

    def build(self) -> W.Widget:
        report = self.run.report
        self.buffer = W.Dropdown(options=[("(none)", "")] + [(f"{b['name']} · {fmt_bytes(b['size'])}", b["name"])
                                                             for b in report.memory["buffers"]],
                                 value="", description="buffer")
        self.step = W.Dropdown(options=[("(none)", -1)] + [(f"{k} · {st['kernel']}", k)
                                                           for k, st in enumerate(report.schedule)],
                               value=-1, description="step")
        self.details = W.HTML()
        self.timeline = W.HTML()
        self.packing = W.HTML()
        self.timeline.add_class("cv-memwrap")
        self.buffer.observe(lambda _: self._render(), "value")
        self.step.observe(lambda _: self._render(), "value")
        self._render()
        steps = step_count(report)
        return W.VBox([W.HTML(memory_summary_html(report)), W.HBox([self.buffer, self.step]), self.details,
                       W.HTML(f'<h4 class="cv-h">Buffer lifetimes over the {steps} steps</h4>'), self.timeline,
                       W.HTML('<h4 class="cv-h">Arena packing</h4>'), self.packing])

    def _render(self) -> None:
        report, name = self.run.report, self.buffer.value
        step = self.step.value if self.step.value >= 0 else None
        self.timeline.value = memory_timeline_svg(report, name, step)
        self.packing.value = memory_packing_svg(report, name, step)
        parts = []
        if name:
            parts.append(buffer_details_html(report, name))
        if step is not None:
            parts.append(step_details_html(report, step))
        self.details.value = "".join(parts)
