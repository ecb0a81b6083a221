"""Numbers from samples: latency summaries, speedups, output errors."""
from __future__ import annotations

import math

import numpy as np


def summarize(samples_ns: list[int]) -> dict:
    """Median, minimum and 90th percentile in ms, and the number of calls."""
    ms = np.asarray(samples_ns, dtype=np.float64) / 1e6
    return {"median_ms": float(np.median(ms)), "min_ms": float(ms.min()),
            "p90_ms": float(np.percentile(ms, 90)), "calls": int(ms.size)}


def speedup(eager_median: float, engine_median: float) -> float:
    """How many times faster than eager (> 1 is faster)."""
    return eager_median / engine_median


def max_abs_error(reference: list[np.ndarray], got: list[np.ndarray]) -> float:
    """Largest |got - reference| over all outputs; infinite if `got` has a NaN or inf where the
    reference is finite. Raises ValueError when the output structure differs."""
    if len(got) != len(reference):
        raise ValueError(f"{len(got)} output(s), eager gives {len(reference)}")
    worst = 0.0
    for i, (ref, out) in enumerate(zip(reference, got)):
        if ref.shape != out.shape:
            raise ValueError(f"output {i} has shape {tuple(out.shape)}, eager's has {tuple(ref.shape)}")
        if ref.size == 0:
            continue
        diff = np.abs(out.astype(np.float64) - ref.astype(np.float64))
        both_nan = np.isnan(ref) & np.isnan(out)
        diff[both_nan] = 0.0
        worst = max(worst, float(np.nan_to_num(diff, nan=math.inf).max()))
    return worst
