"""The explorer: the panels of one compiled cell in a tab widget, under a one-line header."""
from __future__ import annotations

import html

import ipywidgets as W
from IPython.display import display

from cuvil.report_html import CSS

from .panels import ExplorerState, Panel, panel_classes
from .run import CellRun


class Explorer:
    """`Explorer(run)` builds the panels; `explorer.panels["pipeline"]` is a panel object,
    `explorer.widget` what the notebook shows."""

    def __init__(self, run: CellRun, panels: list[str] | None = None):
        self.run = run
        self.state = ExplorerState(stage=1 if run.report.passes else 0)
        self.panels: dict[str, Panel] = {cls.name: cls(run, self.state)
                                         for cls in panel_classes(panels) if cls.available(run)}
        self.tab = W.Tab(children=[p.widget for p in self.panels.values()],
                         titles=[p.title for p in self.panels.values()])
        self.tab.observe(lambda change: self._activate(change["new"]), "selected_index")
        self.state.observe(lambda change: self._show(change["new"]), "show")
        self.widget = W.VBox([W.HTML(f"<style>{CSS}</style>" + self._header()), self.tab])
        self.widget.add_class("cv-root")
        self._activate(0)

    def select(self, name: str) -> Panel:
        """Open a panel's tab, as a click on it would."""
        self.tab.selected_index = list(self.panels).index(name)
        return self.panels[name]

    def _show(self, name: str) -> None:
        if name in self.panels:
            self.select(name)
            self.state.show = ""     # so that asking for the same panel again opens it again

    def _activate(self, index: int | None) -> None:
        for i, panel in enumerate(self.panels.values()):
            panel.active = i == index
            if panel.active:
                panel.shown()

    def _header(self) -> str:
        r = self.run.report
        changed = sum(1 for p in r.passes if p.get("changed"))
        total = sum(ph["time_s"] for ph in r.phases)
        bits = [f"<b>cuvil</b> {html.escape(r.name)}", f"<code>{html.escape(r.pipeline)}</code>",
                f"{len(r.passes)} passes ({changed} changed the IR)", f"compiled in {total:.2f} s"]
        if self.run.engine == "native":
            bits.append(f"native code: {len(r.kernels)} kernels")
        else:
            bits.append(f'<span class="cv-warn">reference interpreter: {html.escape(self.run.note)}</span>')
        if self.run.max_abs_err is not None:
            bits.append(f"max abs error {self.run.max_abs_err:.3g} vs {html.escape(self.run.reference)}")
        if self.run.cached:
            bits.append("<i>cached</i>")
        return '<div class="cv-root">' + " · ".join(bits) + "</div>"

    def _ipython_display_(self) -> None:
        display(self.widget)
