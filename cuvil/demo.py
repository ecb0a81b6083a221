"""`make demo`: the main job on an embedded model, end to end, with what happened printed.

    python -m cuvil.demo [--model bert_small] [--out demo-out]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from . import explain, import_model, interpret, zoo


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cuvil.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bert_small", choices=zoo.names())
    ap.add_argument("--out", default="demo-out", help="folder for the report and IR files")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    entry = zoo.get(args.model)
    print(f"model: {args.model}; dynamic dims: {entry.dynamic}")
    report = explain(entry.model, *entry.example_inputs, dynamic=entry.dynamic, ranges=entry.ranges,
                     name=args.model)
    print(f"\npipeline: {report.pipeline}")
    print(f"{'pass':<16}{'changed':>8}{'ms':>10}  statistics")
    for p in report.passes:
        stats = ", ".join(f"{k}={v}" for k, v in p["statistics"].items())
        print(f"{p['name']:<16}{str(p['changed']):>8}{p['time_s'] * 1e3:>10.2f}  {stats}")

    # The reference interpreter against eager, at sizes other than the export example.
    imported = import_model(entry.model, entry.example_inputs, dynamic=entry.dynamic, ranges=entry.ranges)
    other = {k: v + 3 for k, v in entry.example_sizes.items()}
    inputs = entry.inputs(**other)
    with torch.no_grad():
        expected = torch.utils._pytree.tree_leaves(entry.model(*inputs))
    got = interpret(imported.module, *inputs)
    worst = max(float((g - e).abs().max()) for g, e in zip(got, expected))
    print(f"\ninterpreter vs eager at {other}: max abs error {worst:.2e}")

    (out / "input.cvl").write_text(report.input_ir)
    (out / "output.cvl").write_text(report.output_ir)
    report.save_json(out / "report.json")
    print(f"\n{report.summary()}")
    print(f"report: {out / 'report.json'}   IR: {out / 'input.cvl'}, {out / 'output.cvl'}")
    print(f"try:    .venv/bin/cuvil-opt {out / 'input.cvl'} --pipeline=canonicalize,cse,dce --print-ir-after-change")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
