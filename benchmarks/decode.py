"""Token-by-token decoding of a Hugging Face Llama with its key/value cache, side by side.

A `LlamaForCausalLM` built from a config (random weights, seeded): 8 layers, hidden 512, 8 heads
(4 key/value heads), MLP 1408, vocabulary 8000. Each engine takes a 64-token prompt, then decodes
the same fixed tokens one step at a time, so every engine's cache grows alike and its logits can
be compared with eager's at every step. The engines run in one process at 1 thread, interleaved
step by step in rotating order:
- eager: the model itself, a `DynamicCache` passed in and updated in place;
- inductor: `torch.compile(model)` (Dynamo makes the cache's length dynamic after the first steps);
- ort: ONNX Runtime (CPU, all graph optimisations, 1 thread) on two graphs from the dynamo
  exporter, of a wrapper that takes the cache as one key and one value tensor per layer and
  returns the logits and the grown ones: the prompt's (64 tokens, no past) and a step's (one
  token, the past length a dynamic dim; one graph cannot serve both, as SDPA's `is_causal` would
  depend on the dynamic query length). Each step feeds the present tensors ORT returned as the
  next past; its time is `session.run` on the token (a zero-copy `.numpy()` view) and those
  arrays, plus a zero-copy `torch.from_numpy` of the logits;
- cuvil: `cuvil.compile(model)`: one variant for the prompt, one for every step.
Compile times are each engine's first prompt call and first step (with empty caches for Cuvil and
Inductor; ORT's include exporting that graph and creating its session).

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


class TorchDecoder:
    """Eager, Inductor or Cuvil: the model's own `DynamicCache`, which every step updates in place."""

    def __init__(self, model):
        self.model = model

    def prompt(self, input_ids):
        return self.model(input_ids).past_key_values

    def step(self, input_ids, cache):
        return self.model(input_ids, past_key_values=cache).logits, cache


def flat_cache(model):
    """`model` as a module of (input_ids, *past) returning (logits, *present), the cache as one key
    and one value tensor per layer: what an exported graph can take and return."""
    import torch
    import transformers

    class FlatCache(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, *past):
            cache = transformers.DynamicCache(list(zip(past[::2], past[1::2])))
            logits = self.model(input_ids, past_key_values=cache, use_cache=True).logits
            return logits, *(t for layer in cache.layers for t in (layer.keys, layer.values))

    return FlatCache().eval()


class OrtDecoder:
    """ONNX Runtime on the prompt's graph and a step's, each exported and loaded on its first call;
    the cache is the list of present arrays a call returns."""

    def __init__(self, model, workdir: Path):
        import onnxruntime
        import torch
        self.ort, self.torch = onnxruntime, torch
        self.module = flat_cache(model)
        self.workdir = workdir
        self.sessions = {}

    def prompt(self, input_ids):
        return self.run("prompt", input_ids, [])[1]

    def step(self, input_ids, past):
        return self.run("step", input_ids, past)

    def run(self, graph: str, input_ids, past: list):
        if graph not in self.sessions:
            self.sessions[graph] = self.load(graph, input_ids, past)
        session, names = self.sessions[graph]
        logits, *present = session.run(None, dict(zip(names, [input_ids.numpy(), *past])))
        return self.torch.from_numpy(logits), present

    def load(self, graph: str, input_ids, past: list):
        from .engines import ort_session      # imports torch at its top: only once main() has set the caches
        torch = self.torch
        path = self.workdir / f"{graph}.onnx"
        past_length = torch.export.Dim("past")
        # torch.export sees *past as one argument: its shapes go in one tuple
        dynamic = ({}, tuple({2: past_length} for _ in past)) if past else None
        torch.onnx.export(self.module, (input_ids, *map(torch.from_numpy, past)), str(path), dynamo=True,
                          dynamic_shapes=dynamic, verbose=False)
        session = ort_session(self.ort, path, threads=1)
        return session, [i.name for i in session.get_inputs()]


def run(steps: int, workdir: Path) -> dict:
    import torch

    import cuvil
    torch.set_num_threads(1)
    model = build()
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(1, 8000, (1, PROMPT), generator=gen)
    tokens = torch.randint(1, 8000, (WARM_STEPS + steps, 1, 1), generator=gen)
    engines = {"eager": TorchDecoder(model), "inductor": TorchDecoder(torch.compile(model)),
               "ort": OrtDecoder(model, workdir), "cuvil": TorchDecoder(cuvil.compile(model, threads=1))}
    caches, compile_s, times, errors = {}, {}, {name: [] for name in engines}, {name: 0.0 for name in engines}
    with torch.inference_mode():
        for name, engine in engines.items():
            t0 = time.perf_counter()
            caches[name] = engine.prompt(prompt)
            t1 = time.perf_counter()
            _, caches[name] = engine.step(tokens[0], caches[name])
            compile_s[name] = {"prompt_s": t1 - t0, "first_step_s": time.perf_counter() - t1}
        order = list(engines)
        for i, token in enumerate(tokens[1:]):
            order = order[1:] + order[:1]
            logits = {}
            for name in order:
                t0 = time.perf_counter()
                logits[name], caches[name] = engines[name].step(token, caches[name])
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
            "cuvil_variants": engines["cuvil"].model.num_variants}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    os.environ.setdefault("CUVIL_CACHE_DIR", tempfile.mkdtemp(prefix="cuvil-decode-"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="inductor-decode-"))
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory(prefix="ort-decode-") as workdir:
        result = run(args.steps, Path(workdir))
    print(f"{result['model']}; prompt {result['prompt']}, {result['steps_timed']} steps timed")
    for name, r in result["engines"].items():
        print(f"  {name:9s} {r['median_ms']:7.2f} ms/token (min {r['min_ms']:.2f})  {r['speedup']:5.2f}x eager  "
              f"rel err {r['max_rel_err_vs_eager']:.1e}  prompt {r['prompt_s']:.2f} s, first step {r['first_step_s']:.2f} s")
    print(f"wrote {write_json(result, args.out, 'decode')}")


if __name__ == "__main__":
    main()
