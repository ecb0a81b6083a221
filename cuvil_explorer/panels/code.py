"""The code panel: every kernel's kernel IR, LLVM IR and assembly, with the graph-IR ops it was made
from and the user's source lines they came from. Picking a source line marks (◆) the kernels and ops
it produced and shows the first of them; a kernel marks the source lines it came from; its time in
the profiled run is in the list and the header."""
from __future__ import annotations

import ipywidgets as W

from cuvil.report_html import CODE_VIEWS, kernel_code_html, kernel_header_html, provenance

from . import Panel, register_panel

ALL = ""


@register_panel
class CodePanel(Panel):
    name, title, order = "code", "Code", 22

    @classmethod
    def available(cls, run) -> bool:
        return bool(run.report.kernels)

    def build(self) -> W.Widget:
        self.prov = provenance(self.run.report)
        self.source = ALL
        self._syncing = False
        self.sources = W.Select(rows=min(max(len(self.prov.sources) + 1, 2), 10),
                                layout=W.Layout(width="100%"), description="source")
        self.kernels = W.Select(rows=min(max(len(self.prov.kernels), 2), 12), layout=W.Layout(width="100%"),
                                description="kernel")
        self.view = W.ToggleButtons(options=[(t, v) for v, t in CODE_VIEWS.items()] + [("Side by side", "side")],
                                    value="kernel_ir", style={"button_width": "110px"})
        self.header = W.HTML()
        self.code = W.HTML(layout=W.Layout(width="100%"))
        self.sources.observe(lambda ch: self._syncing or self.select_source(ch["new"] or ALL), "value")
        self.kernels.observe(lambda ch: self._syncing or ch["new"] is None or self.select_kernel(ch["new"]), "value")
        self.view.observe(lambda _: self._render_code(), "value")
        self.state.observe(lambda ch: ch["new"] in self.prov.kernels and self.select_kernel(ch["new"]), "kernel")
        self.current = self.state.kernel if self.state.kernel in self.prov.kernels else next(iter(self.prov.kernels))
        self._relabel()
        self._render()
        return W.VBox([W.HBox([self.sources, self.kernels]), self.header, self.view, self.code])

    # ------------------------------------------------------------------ selection

    def select_source(self, key: str) -> None:
        """Mark the kernels and ops that `key` ("file:line", or "" for none) produced; show the first."""
        self.source = key
        hits = self.prov.sources[key].kernels if key else []
        if hits and self.current not in hits:
            self.current = hits[0]
            self.state.kernel = self.current
        self._relabel()
        self._render()

    def select_kernel(self, name: str) -> None:
        if name == self.current:
            return
        self.current = name
        self.state.kernel = name
        self._relabel()
        self._render()

    def hits(self) -> list[str]:
        """The kernels the selected source line produced."""
        return self.prov.sources[self.source].kernels if self.source else []

    # ------------------------------------------------------------------ drawing

    def _relabel(self) -> None:
        hits = set(self.hits())
        from_kernel = set(self.prov.kernels[self.current].sources)
        self._syncing = True
        try:
            self.sources.options = [("(no source line)", ALL)] + [
                (("◆ " if key in from_kernel else "") + s.label, key) for key, s in self.prov.sources.items()]
            self.sources.value = self.source
            self.kernels.options = [(self.prov.kernel_label(k, k.name in hits), k.name)
                                    for k in self.prov.kernels.values()]
            self.kernels.value = self.current
        finally:
            self._syncing = False

    def _render(self) -> None:
        self.header.value = kernel_header_html(self.prov, self.current, self.source)
        self._render_code()

    def _render_code(self) -> None:
        self.code.value = kernel_code_html(self.prov.kernels[self.current].data, self.view.value)
