"""Token-by-token decoding of a Hugging Face Llama with its key/value cache, side by side.

A `LlamaForCausalLM` built from a config (random weights, seeded): 8 layers, hidden 512, 8 heads
(4 key/value heads), MLP 1408, vocabulary 8000. Each engine takes a 64-token prompt, then decodes
the same fixed tokens one step at a time (a `DynamicCache` passed in and updated in place), so
every engine's cache grows alike and its logits can be compared with eager's at every step. The
engines run in one process at 1 thread, interleaved step by step in rotating order:
- eager: the model itself;
- inductor: `torch.compile(model)` (Dynamo makes the cache's length dynamic after the first steps);
- cuvil: `cuvil.compile(model)`: one variant for the prompt, one for every step.
ONNX Runtime is not in it yet: an exported step takes and returns the cache as separate tensors,
so it needs a loop of its own that feeds them back, which is not written. Compile times are each
engine's first prompt call and first step (with empty caches for Cuvil and Inductor).

    python -m benchmarks.decode [--steps N] [--out DIR]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings
from pathlib import Path
from statistics import median

from .report import write_json

PROMPT, WARM_STEPS = 64, 8


def build():
    import torch
    import transformers
    config = transformers.LlamaConfig(hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                                      num_key_value_heads=4, intermediate_size=1408, vocab_size=8000)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def run(steps: int) -> dict:
    import torch

    import cuvil
    torch.set_num_threads(1)
    model = build()
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(1, 8000, (1, PROMPT), generator=gen)
    tokens = torch.randint(1, 8000, (WARM_STEPS + steps, 1, 1), generator=gen)
    engines = {"eager": model, "inductor": torch.compile(model), "cuvil": cuvil.compile(model, threads=1)}
    caches, compile_s, times, errors = {}, {}, {name: [] for name in engines}, {name: 0.0 for name in engines}
    with torch.inference_mode():
        for name, engine in engines.items():
            t0 = time.perf_counter()
            caches[name] = engine(prompt).past_key_values
            t1 = time.perf_counter()
            engine(tokens[0], past_key_values=caches[name])
            compile_s[name] = {"prompt_s": t1 - t0, "first_step_s": time.perf_counter() - t1}
        order = list(engines)
        for i, token in enumerate(tokens[1:]):
            order = order[1:] + order[:1]
            logits = {}
            for name in order:
                t0 = time.perf_counter()
                logits[name] = engines[name](token, past_key_values=caches[name]).logits
                if i >= WARM_STEPS - 1:
                    times[name].append(time.perf_counter() - t0)
            scale = float(logits["eager"].abs().max())
            for name in engines:
                errors[name] = max(errors[name], float((logits[name] - logits["eager"]).abs().max()) / scale)
    eager = median(times["eager"])
    return {"model": "LlamaForCausalLM, 8 layers, hidden 512, 8 heads (4 kv), MLP 1408, vocab 8000",
            "prompt": PROMPT, "steps_timed": len(times["eager"]), "final_length": caches["eager"].get_seq_length(),
            "engines": {name: {"median_ms": median(t) * 1e3, "min_ms": min(t) * 1e3, "speedup": eager / median(t),
                               "max_rel_err_vs_eager": errors[name], **compile_s[name]} for name, t in times.items()},
            "cuvil_variants": engines["cuvil"].num_variants}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    os.environ.setdefault("CUVIL_CACHE_DIR", tempfile.mkdtemp(prefix="cuvil-decode-"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor-decode-"))
    warnings.filterwarnings("ignore")
    result = run(args.steps)
    print(f"{result['model']}; prompt {result['prompt']}, {result['steps_timed']} steps timed")
    for name, r in result["engines"].items():
        print(f"  {name:9s} {r['median_ms']:7.2f} ms/token (min {r['min_ms']:.2f})  {r['speedup']:5.2f}x eager  "
              f"rel err {r['max_rel_err_vs_eager']:.1e}  prompt {r['prompt_s']:.2f} s, first step {r['first_step_s']:.2f} s")
    print(f"wrote {write_json(result, args.out, 'decode')}")


if __name__ == "__main__":
    main()
