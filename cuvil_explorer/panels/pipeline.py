"""The pipeline panel: the passes with time and changed flag, stepping (slider, prev/next, the
list), the IR before and after the selected pass side by side, a search over every pass's IR, and
a pass bisection: run the numeric check after every pass and name the first that changed the
model's results beyond tolerance."""
from __future__ import annotations

import html

import ipywidgets as W

from cuvil import CuvilError
from cuvil.report_html import diff_html, pass_header_html, pass_label

from . import Panel, register_panel

LONG_IR_LINES = 80   # longer IR opens with only the changed lines (and some context) shown


@register_panel
class PipelinePanel(Panel):
    name, title, order = "pipeline", "Pipeline", 10

    def build(self) -> W.Widget:
        self.passes = self.run.report.passes
        self.current = max(self.state.stage - 1, 0)
        self.visible = list(range(len(self.passes)))
        self._syncing = False
        n = len(self.passes)
        self.prev = W.Button(description="◀ prev", tooltip="previous pass", layout=W.Layout(width="86px"))
        self.next = W.Button(description="next ▶", tooltip="next pass", layout=W.Layout(width="86px"))
        self.slider = W.IntSlider(value=1, min=1, max=max(n, 1), description="pass", continuous_update=False)
        self.position = W.HTML()
        self.hide = W.Checkbox(value=False, description="hide unchanged passes", indent=False,
                               layout=W.Layout(width="190px"))
        long_ir = self.run.report.input_ir.count("\n") > LONG_IR_LINES
        self.context = W.Checkbox(value=long_ir, description="changed lines only", indent=False,
                                  layout=W.Layout(width="160px"))
        self.search = W.Text(placeholder="search the IR", continuous_update=False, layout=W.Layout(width="200px"))
        self.find_next = W.Button(description="find next", layout=W.Layout(width="86px"))
        self.found = W.HTML()
        self.bisect = W.Button(description="bisect numerics", layout=W.Layout(width="130px"),
                               tooltip="check the results after every pass; name the first that changed them")
        self.bisection = W.HTML()
        self.list = W.Select(rows=min(max(n, 2), 14), layout=W.Layout(width="220px", flex="0 0 auto"))
        self.header = W.HTML()
        self.diff = W.HTML(layout=W.Layout(width="100%"))
        self.diff.add_class("cv-diffview")

        self.prev.on_click(lambda _: self.step(-1))
        self.next.on_click(lambda _: self.step(+1))
        self.find_next.on_click(lambda _: self.next_match())
        self.bisect.on_click(lambda _: self.run_bisection())
        self.slider.observe(self._on_slider, "value")
        self.list.observe(self._on_list, "value")
        self.hide.observe(lambda _: self._refilter(), "value")
        self.context.observe(lambda _: self._render(), "value")
        self.search.observe(lambda _: self._on_search(), "value")
        self.state.observe(self._on_stage, "stage")

        self._refilter()
        return W.VBox([
            W.HBox([self.prev, self.slider, self.next, self.position]),
            W.HBox([self.hide, self.context, self.search, self.find_next, self.found, self.bisect]),
            self.bisection,
            W.HBox([self.list, W.VBox([self.header, self.diff], layout=W.Layout(flex="1", min_width="0"))]),
        ])

    # ------------------------------------------------------------------ selection

    def select(self, i: int) -> None:
        """Show pass `i` (0-based) and make it the explorer's stage."""
        self.current = i
        self._sync_controls()
        self._render()
        self.state.stage = i + 1

    def step(self, delta: int) -> None:
        """Move to the previous (-1) or next (+1) visible pass."""
        if not self.visible:
            return
        if self.current in self.visible:
            at = self.visible.index(self.current) + delta
            self.select(self.visible[max(0, min(len(self.visible) - 1, at))])
            return
        ahead = [i for i in self.visible if (i > self.current if delta > 0 else i < self.current)]
        self.select((ahead[0] if delta > 0 else ahead[-1]) if ahead else self.visible[0])

    def matches(self) -> list[int]:
        """The passes whose IR (before or after) contains the search text, case-insensitively."""
        q = self.search.value.lower()
        if not q:
            return []
        return [i for i, p in enumerate(self.passes)
                if q in (p.get("ir_before") or "").lower() or q in (p.get("ir_after") or "").lower()]

    def next_match(self) -> None:
        hits = self.matches()
        if hits:
            self.select(next((i for i in hits if i > self.current), hits[0]))

    def run_bisection(self) -> None:
        """Run the pipeline again with the numeric check after every pass; show the first pass that
        changed the results beyond tolerance (and step to it) and each pass's check in its header."""
        try:
            result = self.run.bisect()
        except CuvilError as e:       # e.g. the interpreter cannot run an op of the model
            self.bisection.value = f'<p class="cv-warn">The bisection could not run: {html.escape(str(e))}</p>'
            return
        for p, check in zip(self.passes, result.checks):
            if check["max_abs_err"] is not None:
                p.setdefault("checks", {})["numeric"] = {"max_abs_err": check["max_abs_err"], "ok": check["ok"]}
        self.bisection.value = result.html()
        if result.first_bad is not None:
            self.hide.value = False
            self.select(result.first_bad)
        else:
            self._render()

    # ------------------------------------------------------------------ events

    def _on_slider(self, change) -> None:
        if not self._syncing and self.visible:
            self.select(self.visible[change["new"] - 1])

    def _on_list(self, change) -> None:
        if not self._syncing and change["new"] is not None:
            self.select(change["new"])

    def _on_stage(self, change) -> None:
        stage = change["new"]
        if stage >= 1 and stage - 1 != self.current:
            self.select(stage - 1)

    def _on_search(self) -> None:
        hits = self.matches()
        q = self.search.value
        if not q:
            self.found.value = ""
        elif hits:
            names = ", ".join(self.passes[i].get("spec") or self.passes[i]["name"] for i in hits)
            self.found.value = f"in {len(hits)} of {len(self.passes)} passes: {html.escape(names)}"
        else:
            self.found.value = "not found"
        self._refilter()
        if hits and self.current not in hits:
            self.select(hits[0])
        else:
            self._render()

    def _refilter(self) -> None:
        hide = self.hide.value
        self.visible = [i for i, p in enumerate(self.passes) if not hide or p.get("changed")]
        hits = set(self.matches())
        self._syncing = True
        self.list.options = [(pass_label(i, self.passes[i]) + ("  ⌕" if i in hits else ""), i) for i in self.visible]
        self.slider.max = max(len(self.visible), 1)
        self._syncing = False
        if self.visible and self.current not in self.visible:
            self.select(self.visible[0])
        else:
            self._sync_controls()
            self._render()

    def _sync_controls(self) -> None:
        self._syncing = True
        try:
            shown = self.current in self.visible
            self.slider.disabled = self.prev.disabled = self.next.disabled = not self.visible
            if shown:
                self.slider.value = self.visible.index(self.current) + 1
                self.list.value = self.current
            n = len(self.passes)
            self.position.value = (f"<b>{self.current + 1} / {n}</b>: "
                                   f"{html.escape(self.passes[self.current].get('spec') or '')}" if n else "")
        finally:
            self._syncing = False

    # ------------------------------------------------------------------ drawing

    def _render(self) -> None:
        if not self.passes:
            self.header.value = '<p class="cv-note">The pipeline ran no passes.</p>'
            self.diff.value = ""
            return
        if not self.visible:
            self.header.value = (f'<p class="cv-note">No pass changed the IR ({len(self.passes)} passes ran). '
                                 f'Untick "hide unchanged passes" to step through them.</p>')
            self.diff.value = ""
            return
        p = self.passes[self.current]
        self.header.value = pass_header_html(self.current, p)
        if p.get("ir_after") is None:
            self.diff.value = '<p class="cv-note">This pass did not run, so there is no IR to show.</p>'
            return
        table = diff_html(p["ir_before"], p["ir_after"], search=self.search.value,
                          context=3 if self.context.value else None,
                          titles=(f"before {p.get('spec')}", f"after {p.get('spec')}"))
        self.diff.value = f'<div class="cv-scroll">{table}</div>'
