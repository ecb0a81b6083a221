"""Compile and load times of the suite's batch-1 models: cold, from the object cache, and saved.

Each model runs in a fresh process with an empty object cache:
- cold: the first `compile_for` (torch.export, the passes, LLVM, loading);
- object cache: a second `cuvil.compile` of the same model, whose kernels the cache holds
  (torch.export and the passes run again; `import` is torch.export's share);
- saved: `cuvil.load` of the file `compiled.save` wrote (no export, passes or LLVM), median of 5,
  and its first call.
`make bench` runs it; results go to `compile_time.json` next to the suite's results.

    python -m benchmarks.compile_time [--out DIR] [CASE ...]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

from .report import write_json

CASES = ("mlp_b1", "cnn_b1", "block_s128", "bert_small_s128", "eltwise_4k")


def measure(case_name: str) -> dict:
    """In this process (a fresh one): the three times of one suite case."""
    import torch

    import cuvil
    from .suite import CASES as SUITE
    torch.set_num_threads(1)
    built = SUITE[case_name].build()
    t = time.perf_counter()
    compiled = cuvil.compile(built.model)
    compiled.compile_for(*built.inputs)
    cold = time.perf_counter() - t
    t = time.perf_counter()
    again = cuvil.compile(built.model)
    again.compile_for(*built.inputs)
    warm = time.perf_counter() - t
    phases = {p["name"]: p["time_s"] for p in again.report.phases}
    loads, first_calls = [], []
    with tempfile.TemporaryDirectory(prefix="cuvil-saved-") as folder:
        path = Path(folder) / f"{case_name}.cuvil"
        compiled.save(path)
        saved_bytes = path.stat().st_size
        for _ in range(5):
            t = time.perf_counter()
            loaded = cuvil.load(path)
            t1 = time.perf_counter()
            out = loaded(*built.inputs)
            first_calls.append(time.perf_counter() - t1)
            loads.append(t1 - t)
    expected = compiled(*built.inputs)
    same = all(torch.equal(a, b) for a, b in zip(torch.utils._pytree.tree_leaves(out),
                                                 torch.utils._pytree.tree_leaves(expected)))
    return {"case": case_name, "cold_s": cold, "cache_s": warm, "cache_import_s": phases.get("import", 0.0),
            "load_s": median(loads), "load_first_call_s": median(first_calls),
            "saved_bytes": saved_bytes, "same_outputs": same}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--one", help=argparse.SUPPRESS)      # the child process: measure one case, print JSON
    ap.add_argument("cases", nargs="*", default=list(CASES))
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.one)))
        return []
    rows = []
    print(f"{'case':18s} {'cold':>8s} {'cache':>8s} {'(export)':>9s} {'load':>8s} {'1st call':>9s} {'file':>8s}")
    for case in args.cases:
        with tempfile.TemporaryDirectory(prefix="cuvil-compile-time-") as cache:
            done = subprocess.run([sys.executable, "-m", "benchmarks.compile_time", "--one", case],
                                  env={**os.environ, "CUVIL_CACHE_DIR": cache}, capture_output=True, text=True,
                                  check=True)
        row = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append(row)
        print(f"{case:18s} {row['cold_s'] * 1e3:6.0f}ms {row['cache_s'] * 1e3:6.0f}ms "
              f"{row['cache_import_s'] * 1e3:7.0f}ms {row['load_s'] * 1e3:6.1f}ms "
              f"{row['load_first_call_s'] * 1e3:7.2f}ms {row['saved_bytes'] / 1e6:6.2f}MB"
              + ("" if row["same_outputs"] else "  OUTPUTS DIFFER"))
    write_json({"rows": rows, "load_average": os.getloadavg()[0]}, args.out, "compile_time")
    return rows


if __name__ == "__main__":
    main()
