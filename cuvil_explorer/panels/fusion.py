"""The fusion panel: the groups the fuse pass formed (kind, what they compute, their kernel) and every
candidate it refused, with the rule and the reason. Picking a group shows its kernel's code and
marks its values in the output IR; picking a refusal marks the two ops it would have joined. The
rule filter narrows the refusals; the kind filter, the groups."""
from __future__ import annotations

import ipywidgets as W

from cuvil.report_html import (CODE_VIEWS, fusion_colours, fusion_ir_html, fusion_rules, fusion_summary_html,
                               group_details_html, group_kernel, group_label, group_marks, is_fused, kernel_code_html,
                               refusal_details_html, refusal_label, refusal_marks, refusals_of)

from . import Panel, register_panel

ALL = ""


@register_panel
class FusionPanel(Panel):
    name, title, order = "fusion", "Fusion", 21

    @classmethod
    def available(cls, run) -> bool:
        fusion = run.report.fusion
        return bool(fusion.get("groups") or fusion.get("refused"))

    def build(self) -> W.Widget:
        report = self.run.report
        self.groups_data = report.fusion.get("groups", [])
        self.refused_data = report.fusion.get("refused", [])
        self.kernels = {k["name"]: k for k in report.kernels}
        self.colours = fusion_colours(report)
        self.selected: tuple[str, int] | None = None    # ("group", i) or ("refused", j)
        self._syncing = False
        kinds = sorted({g["kind"] for g in self.groups_data})
        self.kind = W.Dropdown(options=[("all kinds", ALL)] + [(k, k) for k in kinds], value=ALL, description="kind")
        rules = fusion_rules(report)
        self.rule = W.Dropdown(options=[("all rules", ALL)] + [(f"{r} ({n})", r) for r, n in sorted(rules.items())],
                               value=ALL, description="rule")
        self.groups = W.Select(rows=min(max(len(self.groups_data), 2), 10), layout=W.Layout(width="100%"),
                               description="groups")
        self.refused = W.Select(rows=min(max(len(self.refused_data), 2), 10), layout=W.Layout(width="100%"),
                                description="refused")
        self.details = W.HTML()
        self.view = W.ToggleButtons(options=[(t, v) for v, t in CODE_VIEWS.items()], value="kernel_ir",
                                    style={"button_width": "110px"})
        self.open_code = W.Button(description="open in the Code tab", icon="code", layout=W.Layout(width="auto"))
        self.code = W.HTML(layout=W.Layout(width="100%"))
        self.whole = W.Checkbox(value=False, description="the whole IR", indent=False)
        self.ir = W.HTML(layout=W.Layout(width="100%"))
        self.kernel_box = W.VBox([W.HBox([self.view, self.open_code]), self.code])
        self.kind.observe(lambda _: self._relist(), "value")
        self.rule.observe(lambda _: self._relist(), "value")
        self.groups.observe(lambda ch: self._picked("group", ch["new"]), "value")
        self.refused.observe(lambda ch: self._picked("refused", ch["new"]), "value")
        self.view.observe(lambda _: self._render_code(), "value")
        self.whole.observe(lambda _: self._render_ir(), "value")
        self.open_code.on_click(lambda _: self._open_code())
        self._relist()
        if self.groups_data:     # the first fused group (the shared state is left as it is)
            self._select("group", next((i for i, g in enumerate(self.groups_data) if is_fused(g)), 0))
        else:
            self._render()
        return W.VBox([W.HTML(fusion_summary_html(report)),
                       W.HBox([W.VBox([self.kind, self.groups], layout=W.Layout(width="50%")),
                               W.VBox([self.rule, self.refused], layout=W.Layout(width="50%"))]),
                       self.details, self.kernel_box,
                       W.HBox([W.HTML('<h4 class="cv-h">Output IR</h4>'), self.whole]), self.ir])

    # ------------------------------------------------------------------ selection

    def select_group(self, index: int) -> None:
        """Show group `index` (its position in `report.fusion["groups"]`); its kernel becomes the one
        the user looks at."""
        self._select("group", index)
        if self.kernel():
            self.state.kernel = self.kernel()

    def select_refusal(self, index: int) -> None:
        """Show refused candidate `index` (its position in `report.fusion["refused"]`)."""
        self._select("refused", index)

    def _select(self, which: str, index: int) -> None:
        self.selected = (which, index)
        self._sync_lists()
        self._render()

    def kernel(self) -> str:
        """The kernel of the selected group ("" for a refusal, or a group without a kernel)."""
        if self.selected is None or self.selected[0] != "group":
            return ""
        return group_kernel(self.run.report, self.groups_data[self.selected[1]])

    def shown_groups(self) -> list[int]:
        return [i for i, g in enumerate(self.groups_data) if not self.kind.value or g["kind"] == self.kind.value]

    def shown_refusals(self) -> list[int]:
        return [j for j, r in enumerate(self.refused_data) if not self.rule.value or r["rule"] == self.rule.value]

    def _picked(self, which: str, index: int | None) -> None:
        if self._syncing or index is None:
            return
        if which == "group":
            self.select_group(index)
        else:
            self.select_refusal(index)

    # ------------------------------------------------------------------ drawing

    def _relist(self) -> None:
        report = self.run.report
        self._syncing = True
        try:
            self.groups.options = [(f"{'■' if is_fused(self.groups_data[i]) else '·'} "
                                    + group_label(self.groups_data[i], len(refusals_of(report, i))), i)
                                   for i in self.shown_groups()]
            self.refused.options = [(refusal_label(self.refused_data[j]), j) for j in self.shown_refusals()]
        finally:
            self._syncing = False
        self._sync_lists()

    def _sync_lists(self) -> None:
        """Each list shows the selection when it holds it, and nothing otherwise."""
        which, index = self.selected or ("", -1)
        self._syncing = True
        try:
            self.groups.value = index if which == "group" and index in self.shown_groups() else None
            self.refused.value = index if which == "refused" and index in self.shown_refusals() else None
        finally:
            self._syncing = False

    def _render(self) -> None:
        report = self.run.report
        if self.selected is None:
            self.details.value = '<p class="cv-note">Pick a group or a refused candidate.</p>'
        elif self.selected[0] == "group":
            i = self.selected[1]
            swatch = f'<span class="cv-swatch" style="background: {self.colours[i]}"></span>'
            self.details.value = swatch + group_details_html(report, i)
        else:
            self.details.value = refusal_details_html(report, self.selected[1])
        self.kernel_box.layout.display = None if self.kernel() else "none"
        self._render_code()
        self._render_ir()

    def _render_code(self) -> None:
        kernel = self.kernel()
        self.code.value = kernel_code_html(self.kernels[kernel], self.view.value) if kernel else ""

    def marks(self) -> dict[str, str]:
        """The printed value names marked in the IR, with their css class."""
        if self.selected is None:
            return {}
        which, index = self.selected
        return group_marks(self.run.report, index) if which == "group" else refusal_marks(self.run.report, index)

    def _render_ir(self) -> None:
        self.ir.value = fusion_ir_html(self.run.report, self.marks(), None if self.whole.value else 3)

    def _open_code(self) -> None:
        if self.kernel():
            self.state.kernel = self.kernel()
            self.state.show = "code"
