"""`make demo`: the main job on an embedded model, end to end, with what happened printed.

    python -m cuvil.demo [--model bert_small] [--out demo-out]
"""
from __future__ import annotations

import argparse
import statistics
import time
import warnings
from pathlib import Path

import torch

from . import compile, explain, load, zoo


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cuvil.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bert_small", choices=zoo.names())
    ap.add_argument("--out", default="demo-out", help="folder for the reports and IR files")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    warnings.simplefilter("ignore", FutureWarning)   # torch.export's own deprecation notices
    torch.set_num_threads(1)

    entry = zoo.get(args.model)
    print(f"model: {args.model}; dynamic dims: {entry.dynamic}; ranges: {entry.ranges}")
    report = explain(entry.model, *entry.example_inputs, dynamic=entry.dynamic, ranges=entry.ranges,
                     name=args.model)
    print(f"\npipeline: {report.pipeline}")
    print(f"{'pass':<16}{'changed':>8}{'ms':>10}  statistics")
    for p in report.passes:
        # fuse's decisions (a JSON document) are in the report and its HTML, not on this line
        stats = ", ".join(f"{k}={v}" for k, v in p["statistics"].items() if k != "fusion")
        print(f"{p['name']:<16}{str(p['changed']):>8}{p['time_s'] * 1e3:>10.2f}  {stats}")
    print("\ncompile phases: " + ", ".join(f"{ph['name']} {ph['time_s'] * 1e3:.0f} ms" for ph in report.phases))
    print(f"kernels: {len(report.kernels)}; arena {report.memory['arena_bytes']} bytes "
          f"(naive sum {report.memory['naive_bytes']}) at the example sizes")

    # Native code at sizes other than the export example, against eager.
    fast = compile(entry.model, dynamic=entry.dynamic, ranges=entry.ranges, threads=1)
    sizes = {k: v + 3 for k, v in entry.example_sizes.items()}
    inputs = entry.inputs(**sizes)
    with torch.no_grad():
        expected = torch.utils._pytree.tree_leaves(entry.model(*inputs))
    got = torch.utils._pytree.tree_leaves(fast(*inputs))
    worst = max(float((g - e).abs().max()) for g, e in zip(got, expected))
    print(f"\nnative vs eager at {sizes}: max abs error {worst:.2e}")
    t_cuvil, t_eager = _median_s(lambda: fast(*inputs)), _median_s(lambda: entry.model(*inputs))
    print(f"latency, 1 thread, median: cuvil {t_cuvil * 1e3:.3f} ms, eager {t_eager * 1e3:.3f} ms "
          f"(cuvil/eager = {t_cuvil / t_eager:.2f})")

    # The compiled model saved and loaded back: no export, passes or LLVM on this side.
    fast.save(out / f"{args.model}.cuvil")
    t0 = time.perf_counter()
    loaded = load(out / f"{args.model}.cuvil")
    t_load = time.perf_counter() - t0
    same = all(torch.equal(a, b) for a, b in zip(torch.utils._pytree.tree_leaves(loaded(*inputs)), got))
    print(f"saved model: {out / (args.model + '.cuvil')}, loaded in {t_load * 1e3:.1f} ms, outputs "
          f"{'identical to' if same else 'DIFFERENT from'} the compiled model's")

    (out / "input.cvl").write_text(report.input_ir)
    (out / "output.cvl").write_text(report.output_ir)
    report.save_json(out / "report.json")
    report.save_html(out / "report.html")
    print(f"\n{report.summary()}")
    print(f"report: {out / 'report.html'} (open in a browser), {out / 'report.json'}")
    print(f"IR:     {out / 'input.cvl'}, {out / 'output.cvl'}")
    print(f"try:    .venv/bin/cuvil-opt {out / 'input.cvl'} --pipeline=canonicalize,cse,dce --print-ir-after-change")
    return 0


def _median_s(fn, reps: int = 30) -> float:
    with torch.no_grad():
        fn()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


if __name__ == "__main__":
    raise SystemExit(main())
