"""Pass bisection: which pass of the pipeline changed the model's results?

The pipeline runs again on the input IR (with the model's weights and the cell's example inputs)
under `cuvil.passes.NumericCheck`, which runs the reference interpreter after every pass that changed
the IR and compares with the input IR's results; the first pass beyond tolerance is the culprit.
"""
from __future__ import annotations

import html
from dataclasses import dataclass

import torch

import cuvil
from cuvil import CompileReport
from cuvil.passes import NumericCheck, PassManager


@dataclass
class Bisection:
    checks: list[dict]          # per pass: {"spec", "changed", "max_abs_err" (None: not checked), "ok"}
    first_bad: int | None       # index of the first pass whose results differ beyond tolerance
    rtol: float
    atol: float

    @property
    def culprit(self) -> str | None:
        return None if self.first_bad is None else self.checks[self.first_bad]["spec"]

    def html(self) -> str:
        tol = f"rtol={self.rtol:g}, atol={self.atol:g}"
        if self.first_bad is None:
            head = f"<b>No pass changed the results</b> beyond {tol} (checked after every pass that changed the IR)."
        else:
            c = self.checks[self.first_bad]
            head = (f'<b class="cv-bad">Pass {self.first_bad + 1}, {html.escape(c["spec"])}, changed the results</b>: '
                    f'max abs error {c["max_abs_err"]:.3g} against the input IR ({tol}).')
        rows = []
        for i, c in enumerate(self.checks):
            verdict = ("not checked: IR unchanged" if c["max_abs_err"] is None
                       else f'{c["max_abs_err"]:.3g} {"ok" if c["ok"] else "beyond tolerance"}')
            row = '<tr class="cv-hit">' if i == self.first_bad else "<tr>"
            rows.append(f'{row}<td>{i + 1}. {html.escape(c["spec"])}</td><td>{verdict}</td></tr>')
        return f'<div class="cv-bisect">{head}<table class="cv-ops">{"".join(rows)}</table></div>'


def bisect_passes(report: CompileReport, constants: dict[str, torch.Tensor], inputs: list[torch.Tensor],
                  rtol: float = 1e-4, atol: float = 1e-5) -> Bisection:
    module = cuvil.parse(report.input_ir)
    module.constants.update(constants)
    check = NumericCheck(inputs=inputs, rtol=rtol, atol=atol, raise_on_mismatch=False)
    records = PassManager(report.pipeline, instruments=[check]).run(module)
    checks = []
    for r in records:
        numeric = r.checks.get("numeric")
        checks.append({"spec": r.spec, "changed": r.changed,
                       "max_abs_err": None if numeric is None else numeric["max_abs_err"],
                       "ok": True if numeric is None else numeric["ok"]})
    first_bad = next((i for i, c in enumerate(checks) if not c["ok"]), None)
    return Bisection(checks, first_bad, rtol, atol)
