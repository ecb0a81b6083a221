"""How close Cuvil's GEMM-bound steps come to this machine's sgemm peak (`make bench` runs it).

The peak is OpenBLAS's own `sgemm` (the library Cuvil calls, one thread) on a large square
product, best of several runs. Each case is a `Linear` or `Conv2d` layer compiled with
`cuvil.compile` (bias and activation fused into the GEMM's epilogue; a convolution runs as an
implicit GEMM on its packed weight); its step time comes from the runtime's per-step timestamps
(`compiled.profile`), median of many calls, and its rate is 2*M*N*K flops over that time (for a
convolution M = output positions, N = out channels, K = in channels * kh * kw). Results go to
`gemm_efficiency.json` next to the suite's results. The peak is measured again just before and
after each case (a case whose two peaks differ by more than 15% is measured again, then marked).

Then the floors: for the suite's models whose time is mostly matrix products, those products'
FLOPs (torch's FlopCounterMode over an eager call) at the fastest GEMM rate this run measured
(Cuvil's steps, OpenBLAS's and torch's own `mm`), as a time, and that time over eager's median in
the suite's `latest.json`: no engine's latency ratio to eager can be lower at that rate.

    python -m benchmarks.gemm_efficiency [--out DIR]
"""
from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import time
from pathlib import Path

import torch
from torch import nn

import cuvil
from cuvil.runtime import blas, set_num_threads

from .report import write_json

PEAK_SIZE = 1024
UNSTEADY = 0.15        # peaks before and after a case further apart than this: the machine changed speed
# (label, batch rows M, in features K, out features N): the suite's GEMM shapes
CASES = [("MLP b64 fc2", 64, 1024, 1024), ("MLP b64 fc1", 64, 512, 1024),
         ("BERT-small s128 FFN up", 128, 256, 1024), ("BERT-small s128 QKV", 128, 256, 768),
         ("square 512", 512, 512, 512)]
# (label, batch, in channels, out channels, image size, stride): the CNN b16's GEMM convolutions
# and a ResNet-sized 3x3 one (kernel 3, padding 1)
CONV_CASES = [("CNN b16 stem 3->16", 16, 3, 16, 32, 1), ("CNN b16 block 16->32 s2", 16, 16, 32, 16, 2),
              ("3x3 64->64 16x16 b8", 8, 64, 64, 16, 1)]


def bracketed(measure, peak=lambda: sgemm_peak_gflops(repeats=3), attempts: int = 3):
    """(GFLOP/s, µs, peak before, peak after, steady) of `measure()` between two peak measurements.

    This shared machine's speed changes by up to 2x from one minute to the next, so a case is set
    against the peak measured just before and just after it; when the two differ by more than
    UNSTEADY the machine changed speed meanwhile and the ratio says little: the case is measured
    again, up to `attempts` times, and the last try is returned marked unsteady."""
    for _ in range(attempts):
        before = peak()
        gflops, us = measure()
        after = peak()
        steady = abs(before - after) <= UNSTEADY * max(before, after)
        if steady:
            break
    return gflops, us, before, after, steady


def torch_mm_gflops(n: int = PEAK_SIZE, repeats: int = 7) -> float:
    """torch.mm (eager's own GEMM library) on n x n x n, best of `repeats` (GFLOP/s)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best / 1e9


def sgemm_peak_gflops(n: int = PEAK_SIZE, repeats: int = 7) -> float:
    """OpenBLAS sgemm on n x n x n, one thread, best of `repeats` (GFLOP/s)."""
    a, b, c = (torch.randn(n, n) for _ in range(3))
    fn = blas.library().scipy_cblas_sgemm
    f32, i32 = ctypes.c_float, ctypes.c_int
    args = (i32(blas.ROW_MAJOR), i32(blas.NO_TRANS), i32(blas.NO_TRANS), i32(n), i32(n), i32(n), f32(1.0),
            ctypes.c_void_p(a.data_ptr()), i32(n), ctypes.c_void_p(b.data_ptr()), i32(n), f32(0.0),
            ctypes.c_void_p(c.data_ptr()), i32(n))
    fn(*args)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn(*args)
        best = min(best, time.perf_counter() - t)
    torch.testing.assert_close(c, a @ b, rtol=1e-4, atol=1e-3)
    return 2 * n ** 3 / best / 1e9


def gemm_step_gflops(m: int, k: int, n: int, calls: int = 60) -> tuple[float, float]:
    """(GFLOP/s of the GEMM step of a compiled Linear+ReLU at M x K -> N, its median step time in µs)."""
    torch.manual_seed(0)
    layer = nn.Sequential(nn.Linear(k, n), nn.ReLU()).eval()
    return _step_gflops(layer, torch.randn(m, k), "cuvil.linear", 2 * m * n * k, calls)


def conv_step_gflops(batch: int, cin: int, cout: int, size: int, stride: int,
                     calls: int = 60) -> tuple[float, float]:
    """The same for a compiled 3x3 Conv2d+ReLU (padding 1) on `batch` images of size x size."""
    torch.manual_seed(0)
    layer = nn.Sequential(nn.Conv2d(cin, cout, 3, stride, padding=1), nn.ReLU()).eval()
    positions = batch * (-(-size // stride)) ** 2
    return _step_gflops(layer, torch.randn(batch, cin, size, size), "cuvil.conv2d",
                        2 * positions * cout * cin * 9, calls)


def _step_gflops(layer: nn.Module, x: torch.Tensor, op_name: str, flops: int, calls: int) -> tuple[float, float]:
    compiled = cuvil.compile(layer)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), layer(x), rtol=1e-4, atol=1e-4)
    gemm_steps = {st["step"] for st in compiled.report.schedule
                  if any(op["name"] == op_name for op in _kernel(compiled, st["kernel"])["ops"])}
    times = []
    for _ in range(calls):
        _, timings = compiled.profile(x)
        spans = [t for t in timings if t.step in gemm_steps]
        times.append((max(t.end_ns for t in spans) - min(t.start_ns for t in spans)) / 1e3)
    us = statistics.median(times)
    return flops / (us * 1e-6) / 1e9, us


# the suite's models whose time is mostly matrix products: their floor at this run's best GEMM rate
FLOOR_CASES = ("mlp_b64", "block_s128", "bert_small_s128", "convnext_b1", "cnn_b16")


def product_flops(case_name: str) -> int:
    """The FLOPs of a suite case's matrix products and convolutions, counted by torch's
    FlopCounterMode over one eager call (elementwise work, softmax and norms are not counted)."""
    from torch.utils.flop_counter import FlopCounterMode

    from .suite import CASES as SUITE
    built = SUITE[case_name].build()
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        built.model(*built.inputs)
    return counter.get_total_flops()


def floors(best_gflops: float, latest: dict | None, cases=FLOOR_CASES) -> list[dict]:
    """Per case: the time its products alone take at `best_gflops` (the fastest GEMM step this run
    measured), and that floor against eager's 1-thread median in `latest` (the suite's results)
    where it is there: the smallest latency ratio to eager any engine reaches at that rate."""
    eager = {row["case"]: row["threads"].get("1", {}).get("engines", {}).get("eager", {}).get("median_ms")
             for row in (latest or {}).get("cases", [])}
    rows = []
    for case in cases:
        flops = product_flops(case)
        floor_ms = flops / (best_gflops * 1e9) * 1e3
        row = {"case": case, "product_mflop": round(flops / 1e6, 1), "floor_ms": round(floor_ms, 3)}
        if eager.get(case):
            row |= {"eager_ms": eager[case], "floor_vs_eager": round(floor_ms / eager[case], 3)}
        rows.append(row)
    return rows


def _kernel(compiled, name: str) -> dict:
    return next(k for k in compiled.report.kernels if k["name"] == name)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    set_num_threads(1)
    rows = []
    cases = [(label, f"{m}x{k}->{n}", {"m": m, "k": k, "n": n}, lambda m=m, k=k, n=n: gemm_step_gflops(m, k, n))
             for label, m, k, n in CASES]
    cases += [(label, "conv 3x3", {"batch": b, "in": cin, "out": cout, "size": size, "stride": stride},
               lambda b=b, cin=cin, cout=cout, size=size, stride=stride: conv_step_gflops(b, cin, cout, size, stride))
              for label, b, cin, cout, size, stride in CONV_CASES]
    for label, shape, fields, measure in cases:
        gflops, us, before, after, steady = bracketed(measure)
        peak = (before + after) / 2
        rows.append({"case": label, **fields, "step_us": round(us, 1), "gflops": round(gflops, 1),
                     "peak_gflops": round(peak, 1), "peak_before_after": [round(before, 1), round(after, 1)],
                     "steady": steady, "fraction_of_peak": round(gflops / peak, 3)})
        print(f"{label:24s} {shape:14s} {us:8.1f} µs  {gflops:6.1f} GFLOP/s  {gflops / peak:6.1%} of the "
              f"peak then ({before:.1f} before, {after:.1f} after)" + ("" if steady else "  UNSTEADY"))
    fastest = max([r["gflops"] for r in rows] + [p for r in rows for p in r["peak_before_after"]]
                  + [torch_mm_gflops()])
    latest = Path(args.out) / "latest.json"
    floor_rows = floors(fastest, json.loads(latest.read_text()) if latest.exists() else None)
    for f in floor_rows:
        print(f"floor {f['case']:16s} {f['product_mflop']:7.1f} MFLOP in products at {fastest:.1f} GFLOP/s: "
              f"{f['floor_ms']:.2f} ms" + (f" = {f['floor_vs_eager']:.2f}x eager's {f['eager_ms']:.3g} ms"
                                           if "eager_ms" in f else ""))
    result = {"peak_size": PEAK_SIZE, "threads": 1, "cases": rows, "fastest_gflops": fastest, "floors": floor_rows}
    write_json(result, args.out, "gemm_efficiency")
    return result


if __name__ == "__main__":
    main()
