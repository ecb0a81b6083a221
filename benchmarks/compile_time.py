"""Compile and load times of the suite's batch-1 models: cold, from the caches, and saved.

Each model gets an empty cache folder and three fresh processes in turn:
- cold: the first `compile_for` (torch.export, the passes, LLVM, loading); it writes the object
  cache and the compiled-model cache;
- from the model cache: the same compile in a second fresh process, which loads the cached
  program (no torch.export, passes or LLVM), and its outputs must equal the cold compile's;
- from the object cache: the same compile with `cache="objects"` (torch.export and the passes run
  again, LLVM's objects come from the cache; `import` is torch.export's share);
- saved: `cuvil.load` of the file `compiled.save` wrote, median of 5, and its first call.
Each process runs a full garbage collection before it times anything: Python's first one after
the imports (60-77 ms over the objects torch and sympy made) fell into whichever stage allocated
then, and made a 10-15 ms load from the model cache read 80-95 ms.
`make bench` runs it; results go to `compile_time.json` next to the suite's results.

    python -m benchmarks.compile_time [--out DIR] [CASE ...]
"""
from __future__ import annotations

import argparse
import gc
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
STAGES = ("cold", "again")


def _compile(model, inputs, **options) -> tuple[object, float]:
    import cuvil
    t = time.perf_counter()
    compiled = cuvil.compile(model, **options)
    compiled.compile_for(*inputs)
    return compiled, time.perf_counter() - t


def _same(a, b) -> bool:
    import torch
    la, lb = torch.utils._pytree.tree_leaves(a), torch.utils._pytree.tree_leaves(b)
    return len(la) == len(lb) and all(torch.equal(x, y) for x, y in zip(la, lb))


def measure(case_name: str, stage: str, folder: str) -> dict:
    """In this process (a fresh one): one stage of one suite case. `folder` keeps what the cold
    stage leaves for the next (its outputs and the saved model)."""
    import torch

    import cuvil
    from .suite import CASES as SUITE
    torch.set_num_threads(1)
    built = SUITE[case_name].build()
    outputs = Path(folder) / "outputs.pt"
    # Python's first full collection after the imports walks every object torch and sympy made
    # (60-77 ms here), and falls on whatever allocates then: the process's start-up, not a compile's
    gc.collect()
    if stage == "cold":
        compiled, cold = _compile(built.model, built.inputs)
        expected = compiled(*built.inputs)
        torch.save(torch.utils._pytree.tree_leaves(expected), outputs)     # tensors only: a plain load reads them
        path = Path(folder) / f"{case_name}.cuvil"
        compiled.save(path)
        loads, first_calls = [], []
        for _ in range(5):
            t = time.perf_counter()
            loaded = cuvil.load(path)
            t1 = time.perf_counter()
            out = loaded(*built.inputs)
            first_calls.append(time.perf_counter() - t1)
            loads.append(t1 - t)
        cuvil.model_cache.flush()          # the entry is written in the background
        store = next((p for p in compiled.report.phases if p["name"] == "model_cache_store"), {})
        return {"cold_s": cold, "load_s": median(loads), "load_first_call_s": median(first_calls),
                "saved_bytes": path.stat().st_size, "same_outputs": _same(out, expected),
                "model_cache_store": store.get("error", "stored" if store else "not stored"),
                "model_cache_entries_cold": _entries()}
    expected = torch.load(outputs)
    cached, from_models = _compile(built.model, built.inputs)
    hit = cached.from_model_cache
    # after a miss the compile stores its own entry: a second file means the call's key differed,
    # the same file rewritten that the entry did not load or did not accept the call
    entries = _entries()
    objects, from_objects = _compile(built.model, built.inputs, cache="objects")
    phases = {p["name"]: p["time_s"] for p in objects.report.phases}
    return {"model_cache_s": from_models, "model_cache_hit": hit,
            "model_cache_same_outputs": _same(cached(*built.inputs), expected),
            "model_cache_entries": entries, "cache_s": from_objects, "cache_import_s": phases.get("import", 0.0)}


def _entries() -> list[str]:
    """The compiled-model cache's entries (file names), the most recently written first."""
    from cuvil import model_cache
    return [e.path.name for e in model_cache.entries()]


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    ap.add_argument("--one", nargs=3, help=argparse.SUPPRESS)   # the child: CASE STAGE FOLDER, prints JSON
    ap.add_argument("cases", nargs="*", default=list(CASES))
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(measure(*args.one)))
        return []
    rows = []
    print(f"{'case':18s} {'cold':>8s} {'model$':>8s} {'objects$':>9s} {'(export)':>9s} {'load':>8s} "
          f"{'1st call':>9s} {'file':>8s}")
    for case in args.cases:
        row = {"case": case}
        with tempfile.TemporaryDirectory(prefix="cuvil-compile-time-") as folder:
            for stage in STAGES:
                done = subprocess.run([sys.executable, "-m", "benchmarks.compile_time", "--one", case, stage, folder],
                                      env={**os.environ, "CUVIL_CACHE_DIR": str(Path(folder) / "cache")},
                                      capture_output=True, text=True, check=True)
                row.update(json.loads(done.stdout.strip().splitlines()[-1]))
        rows.append(row)
        print(f"{case:18s} {row['cold_s'] * 1e3:6.0f}ms {row['model_cache_s'] * 1e3:6.1f}ms "
              f"{row['cache_s'] * 1e3:7.0f}ms {row['cache_import_s'] * 1e3:7.0f}ms {row['load_s'] * 1e3:6.1f}ms "
              f"{row['load_first_call_s'] * 1e3:7.2f}ms {row['saved_bytes'] / 1e6:6.2f}MB"
              + ("" if row["same_outputs"] and row["model_cache_same_outputs"] else "  OUTPUTS DIFFER")
              + ("" if row["model_cache_hit"] else "  MODEL CACHE MISSED"))
    write_json({"rows": rows, "load_average": os.getloadavg()[0]}, args.out, "compile_time")
    return rows


if __name__ == "__main__":
    main()
