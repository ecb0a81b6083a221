"""The code panel: every kernel's kernel IR, LLVM IR and assembly, with the graph-IR ops it was made
from and the user's source lines they came from. Picking a source line marks (◆) the kernels and ops
it produced, shows the first of them and marks those ops' lines of code; a kernel marks the source
lines it came from; its time in the profiled run is in the list and the header.

Inside a kernel, provenance is per op: picking an op marks its lines in the kernel IR, LLVM IR and
assembly (from the debug locations, `report.kernels[i]["op_lines"]`), and picking lines of code
(`lines`, in the view shown; the assembly when side by side) picks the op they came from and its
source line. In the browser, clicking an op or a line of code does the same without a kernel."""
from __future__ import annotations

import re

import ipywidgets as W

from cuvil.report_html import CODE_VIEWS, kernel_code_html, kernel_header_html, provenance

from . import Panel, register_panel

ALL = ""
NO_OP = -1
_LINES = re.compile(r"^\s*(\d+)\s*(?:[-–]\s*(\d+))?\s*$")


@register_panel
class CodePanel(Panel):
    name, title, order = "code", "Code", 22

    @classmethod
    def available(cls, run) -> bool:
        return bool(run.report.kernels)

    def build(self) -> W.Widget:
        self.prov = provenance(self.run.report)
        self.source = ALL
        self.picked: int | None = None
        self._syncing = False
        self.sources = W.Select(rows=min(max(len(self.prov.sources) + 1, 2), 10),
                                layout=W.Layout(width="100%"), description="source")
        self.kernels = W.Select(rows=min(max(len(self.prov.kernels), 2), 12), layout=W.Layout(width="100%"),
                                description="kernel")
        self.view = W.ToggleButtons(options=[(t, v) for v, t in CODE_VIEWS.items()] + [("Side by side", "side")],
                                    value="kernel_ir", style={"button_width": "110px"})
        self.op = W.Dropdown(description="op", layout=W.Layout(width="60%"))
        self.lines = W.Text(description="lines", placeholder="e.g. 40-52 of the code shown", continuous_update=False,
                            layout=W.Layout(width="35%"))
        self.header = W.HTML()
        self.code = W.HTML(layout=W.Layout(width="100%"))
        self.sources.observe(lambda ch: self._syncing or self.select_source(ch["new"] or ALL), "value")
        self.kernels.observe(lambda ch: self._syncing or ch["new"] is None or self.select_kernel(ch["new"]), "value")
        self.view.observe(lambda _: self._render_code(), "value")
        self.op.observe(lambda ch: self._syncing or self.select_op(None if ch["new"] == NO_OP else ch["new"]), "value")
        self.lines.observe(lambda ch: self._lines_typed(ch["new"]), "value")
        self.state.observe(lambda ch: ch["new"] in self.prov.kernels and self.select_kernel(ch["new"]), "kernel")
        self.current = self.state.kernel if self.state.kernel in self.prov.kernels else next(iter(self.prov.kernels))
        self._relabel()
        self._render()
        box = W.VBox([W.HBox([self.sources, self.kernels]), self.header, self.view, W.HBox([self.op, self.lines]),
                      self.code])
        box.add_class("cv-provroot")     # the browser-side picking (report_html.PICK_JS) works inside it
        return box

    # ------------------------------------------------------------------ selection

    def select_source(self, key: str) -> None:
        """Mark the kernels and ops that `key` ("file:line", or "" for none) produced, and their lines
        of code; show the first kernel."""
        self.source = key
        hits = self.prov.sources[key].kernels if key else []
        if hits and self.current not in hits:
            self.current = hits[0]
            self.picked = None
            self.state.kernel = self.current
        self._relabel()
        self._render()

    def select_kernel(self, name: str) -> None:
        if name == self.current:
            return
        self.current = name
        self.picked = None
        self.state.kernel = name
        self._relabel()
        self._render()

    def select_op(self, op: int | None) -> None:
        """Pick op `op` of the shown kernel (None: none): its lines of code are marked in every view."""
        self.picked = op
        self._relabel()
        self._render()

    def select_lines(self, view: str, first: int, last: int | None = None) -> list[int]:
        """Lines `first`..`last` of the kernel's `view` ("kernel_ir", "llvm_ir", "asm"): pick the op
        they came from (the first, if several) and select its source line. Returns the ops found."""
        ops = self.prov.kernels[self.current].ops_in(view, first, first if last is None else last)
        if ops:
            key = self.prov.op_source.get(ops[0], ALL)
            self.picked = ops[0]
            if key != self.source:
                self.select_source(key)
                return ops
        self.select_op(ops[0] if ops else None)
        return ops

    def hits(self) -> list[str]:
        """The kernels the selected source line produced."""
        return self.prov.sources[self.source].kernels if self.source else []

    def marks(self) -> dict[int, str]:
        """op id -> how its lines are marked: the picked op, and the ops from the selected source line."""
        out = {op["id"]: "cv-hit" for op in self.prov.kernels[self.current].data["ops"]
               if self.source and self.prov.op_source.get(op["id"]) == self.source}
        if self.picked is not None:
            out[self.picked] = "cv-pick"
        return out

    def _lines_typed(self, text: str) -> None:
        m = _LINES.match(text or "")
        if m:
            view = "asm" if self.view.value == "side" else self.view.value
            self.select_lines(view, int(m[1]), int(m[2] or m[1]))

    # ------------------------------------------------------------------ drawing

    def _relabel(self) -> None:
        hits = set(self.hits())
        kernel = self.prov.kernels[self.current]
        from_kernel = set(kernel.sources)
        self._syncing = True
        try:
            self.sources.options = [("(no source line)", ALL)] + [
                (("◆ " if key in from_kernel else "") + s.label, key) for key, s in self.prov.sources.items()]
            self.sources.value = self.source
            self.kernels.options = [(self.prov.kernel_label(k, k.name in hits), k.name)
                                    for k in self.prov.kernels.values()]
            self.kernels.value = self.current
            self.op.options = [("(no op)", NO_OP)] + [
                (f"{op['id']}  {self.prov.op_lines.get(op['id'], op['name'])}", op["id"]) for op in kernel.data["ops"]]
            self.op.value = NO_OP if self.picked is None else self.picked
        finally:
            self._syncing = False

    def _render(self) -> None:
        self.header.value = kernel_header_html(self.prov, self.current, self.source, self.picked)
        self._render_code()

    def _render_code(self) -> None:
        self.code.value = kernel_code_html(self.prov.kernels[self.current], self.view.value, self.marks())
