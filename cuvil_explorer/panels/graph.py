"""The graph panel: the dataflow graph of the IR at the selected stage, drawn by graphviz. Node
ids stay the same across passes; ops the selected pass created or edited are coloured, and
fusion groups (when the report has them) are boxed on the output IR."""
from __future__ import annotations

import ipywidgets as W

from cuvil.report_html import fusion_clusters, graph_notes_html, graph_svg

from . import Panel, register_panel


@register_panel
class GraphPanel(Panel):
    name, title, order = "graph", "Graph", 20

    def build(self) -> W.Widget:
        stages = self.run.stages
        self.stage_pick = W.Dropdown(options=[(st.title, k) for k, st in enumerate(stages)],
                                     value=min(self.state.stage, len(stages) - 1), description="IR")
        self.notes = W.HTML()
        self.svg = W.HTML('<p class="cv-note">drawn when this tab is opened</p>')
        self.svg.add_class("cv-graph")
        self._drawn: int | None = None
        self.stage_pick.observe(self._on_pick, "value")
        self.state.observe(self._on_stage, "stage")
        return W.VBox([self.stage_pick, self.notes, self.svg])

    def shown(self) -> None:
        self.draw()

    def draw(self) -> None:
        """Draw the selected stage (cached per stage on the run)."""
        k = self.stage_pick.value
        if self._drawn == k:
            return
        stages = self.run.stages
        if k not in self.run.svgs:
            # fusion groups name values of the output IR: box them on the stages that show it
            clusters = fusion_clusters(self.run.report) if stages[k].functions is stages[-1].functions else []
            self.run.svgs[k] = graph_svg(stages[k], clusters)
        svg = self.run.svgs[k]
        self.notes.value = graph_notes_html(stages[k])
        self.svg.value = f'<div class="cv-graph">{svg}</div>' if svg else \
            '<p class="cv-note">graphviz (the Python package and the `dot` program) is not installed.</p>'
        self._drawn = k

    def _on_pick(self, change) -> None:
        self.state.stage = change["new"]
        if self.active:
            self.draw()

    def _on_stage(self, change) -> None:
        self.stage_pick.value = change["new"]
