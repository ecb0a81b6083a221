"""The summary panel: compile time per phase, passes, op counts before and after, the run and its
error against the reference, what the cell compiled."""
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
        extra = [("Cell", cell)]
        if run.result is not None:
            rows = [("result", html.escape(_describe(run.result))),
                    (f"max abs error vs {run.reference}", f"{run.max_abs_err:.3g}")]
            rows += [(f"time: {k}", f"{v * 1e3:.1f} ms") for k, v in run.times.items()]
            extra.append(("Run", rows))
        return W.HTML(summary_html(run.report, run.stages, extra))
