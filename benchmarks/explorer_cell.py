"""Wall time of a `%%cuvil` cell on BERT-small (dynamic batch and sequence): cold, unchanged, edited,
and with another pipeline.

Cold: a fresh process whose earlier "cells" only imported and built the model, with an empty
object cache, so the cell captures, runs every pass, compiles to native code, builds the report
and its panels, runs the model natively and against eager, and profiles one run. Unchanged: the
same cell again, which the explorer's cell cache answers. Edited: the cell after the model's
feed-forward activation became ReLU (an edit a user makes): everything runs again, but LLVM
compiles only the modules the object cache lacks. Pipeline: the edited cell with `--passes O1`,
which starts from the import the edited cell made (no torch.export). `make bench` runs it; results go to
`explorer_cell.json` next to the suite's results.

    python -m benchmarks.explorer_cell [--out DIR]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from unittest import mock

from .report import write_json

CELL_LINE = "--dynamic m.dynamic --ranges m.ranges"
CELL = "m.model(*m.example_inputs)"
EDIT = "import torch\nfor layer in m.model.encoder.layer:\n    layer.intermediate.intermediate_act_fn = torch.nn.ReLU()"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args(argv)
    os.environ["CUVIL_CACHE_DIR"] = tempfile.mkdtemp(prefix="cuvil-cell-")
    from IPython.core.interactiveshell import InteractiveShell

    import cuvil_explorer.magic as magic
    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "cuvil_explorer")
    shell.run_cell("from cuvil import zoo\nm = zoo.get('bert_small')")
    result = {"model": "bert_small", "load_average": os.getloadavg()[0]}
    for run in ("cold", "unchanged", "edited", "pipeline"):
        if run == "edited" and not shell.run_cell(EDIT).success:
            raise SystemExit("the edit failed")
        shown: list = []
        t = time.perf_counter()
        with mock.patch.object(magic, "display", shown.append):
            shell.run_cell_magic("cuvil", CELL_LINE + (" --passes O1" if run == "pipeline" else ""), CELL)
        result[f"{run}_s"] = round(time.perf_counter() - t, 3)
        if shell.user_ns["_cuvil_error"] is not None:
            raise SystemExit(f"the cell failed: {shell.user_ns['_cuvil_error']}")
        if shell.user_ns["_cuvil_explorer"].run.cached != (run == "unchanged"):
            raise SystemExit(f"the {run} cell {'missed' if run == 'unchanged' else 'hit'} the cell cache")
        if run != "unchanged":
            phases = {p["name"]: round(p["time_s"], 3) for p in shell.user_ns["_cuvil_report"].phases}
            result["phases_s" if run == "cold" else f"{run}_phases_s"] = phases
    print(f"%%cuvil on BERT-small: cold {result['cold_s']:.2f} s, unchanged {result['unchanged_s']:.2f} s, "
          f"edited {result['edited_s']:.2f} s, another pipeline {result['pipeline_s']:.2f} s "
          f"(load average {result['load_average']:.2f}); phases {result['phases_s']}; edited {result['edited_phases_s']}; "
          f"another pipeline {result['pipeline_phases_s']}")
    write_json(result, args.out, "explorer_cell")
    return result


if __name__ == "__main__":
    main()
