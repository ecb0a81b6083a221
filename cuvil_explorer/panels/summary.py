"""The summary panel: compile time per phase, passes, op counts before and after, the native code
(kernels, arena against the naive sum), the run: its error against the reference and its speed
(medians of a few runs of the compiled model and of the reference), what the cell compiled."""
from __future__ import annotations

import html

import ipywidgets as W
import torch
import torch.utils._pytree as pytree

from cuvil.report_html import summary_html

from . import Panel, register_panel


def _describe(value) -> str:
    tensors = [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]
    return ", ".join(f"{str(t.dtype).replace('torch.', '')}{list(t.shape)}" for t in tensors) or type(value).__name__


@register_panel
class SummaryPanel(Panel):
    name, title, order = "summary", "Summary", 30

    def build(self) -> W.Widget:
        run, t = self.run, self.run.target
        cell = [("compiled", f"<code>{html.escape(t.label)}</code> ({html.escape(t.how)})")]
        if not t.is_ir:
            cell.append(("example inputs", html.escape(_describe((t.args, t.kwargs)))))
        cell.append(("cache", "hit: shown from the cell cache, nothing recompiled" if run.cached else "miss"))
        low = [p["options"]["dtype"] for p in run.report.passes if p["name"] == "mixed-precision" and not p["skipped"]]
        if low:
            cell.append(("precision", f"{low[-1]}: torch.autocast's numerics (values rounded to {low[-1]} where "
                                      f"autocast computes in it); the error below is against fp32"))
        extra = [("Cell", cell)]
        if run.engine != "native":
            cell.append(("runs on", f'<span class="cv-warn">the reference interpreter: {html.escape(run.note)}</span>'))
        elif run.note:
            cell.append(("target", html.escape(run.note)))
        if run.result is not None:
            extra.append(("Run", [("result", html.escape(_describe(run.result))),
                                  (f"max abs error vs {run.reference}", f"{run.max_abs_err:.3g}")]))
        return W.HTML(summary_html(run.report, run.stages, extra))
