"""Side-by-side benchmarks: eager PyTorch, torch.compile (Inductor), ONNX Runtime and Cuvil.

`python -m benchmarks.run` (or `make bench`) runs the suite and writes `benchmarks/results/latest.json`
and `latest.md`. Each engine at each thread count runs in its own worker process; the parent
process interleaves their timing blocks so that every ratio to eager is taken under the same load.
"""
