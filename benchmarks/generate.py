"""Hugging Face's own `generate`, greedy, on a compiled forward, side by side with eager.

Two decoders built from configs (random weights, seeded), at 1 thread: `llama`, as in
`benchmarks.decode` (8 layers, hidden 512), and `mixtral`, a mixture of experts (4 layers, hidden
256, 8 experts of 512, 2 a token). Each engine replaces the model's `forward` and runs
`model.generate` on the same 64-token prompt for 64 new tokens:
- eager: the model's own forward;
- inductor: `torch.compile(model.forward)`;
- cuvil: `cuvil.compile(model.forward)`.
ONNX Runtime has no `generate` of its own here (`benchmarks.decode` times its steps). The runs
are interleaved, engine by engine in rotating order, after one run each that compiles; every
engine's tokens must be eager's. Times are medians of whole `generate` calls (prompt and steps).

    python -m benchmarks.generate [--runs N] [--models llama,mixtral] [--engines eager,inductor,cuvil]
"""
from __future__ import annotations

import argparse
import time
import warnings
from statistics import median

PROMPT, NEW_TOKENS = 64, 64


def build(name: str):
    import torch
    import transformers
    torch.manual_seed(0)
    if name == "llama":
        config = transformers.LlamaConfig(hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                                          num_key_value_heads=4, intermediate_size=1408, vocab_size=8000)
        return transformers.LlamaForCausalLM(config).eval()
    config = transformers.MixtralConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                                        num_key_value_heads=4, intermediate_size=512, vocab_size=8000,
                                        num_local_experts=8, num_experts_per_tok=2)
    return transformers.MixtralForCausalLM(config).eval()


def forward_of(engine: str, model):
    import torch
    if engine == "eager":
        return type(model).forward.__get__(model)
    if engine == "inductor":
        return torch.compile(type(model).forward.__get__(model))
    import cuvil
    return cuvil.compile(type(model).forward.__get__(model))


def run(name: str, engines: list[str], runs: int) -> dict:
    import torch
    model = build(name)
    prompt = torch.randint(0, model.config.vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    options = dict(max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0)
    forwards = {e: forward_of(e, model) for e in engines}
    times: dict[str, list[float]] = {e: [] for e in engines}
    first: dict[str, float] = {}
    want = None
    with torch.no_grad():
        for r in range(runs + 1):
            for e in engines[r % len(engines):] + engines[:r % len(engines)]:
                model.forward = forwards[e]
                t = time.perf_counter()
                tokens = model.generate(prompt, **options)
                seconds = time.perf_counter() - t
                if r == 0:
                    first[e] = seconds
                    want = tokens if e == "eager" or want is None else want
                    if not torch.equal(tokens, want):
                        raise SystemExit(f"{name}: {e}'s tokens are not eager's")
                else:
                    times[e].append(seconds)
    return {e: {"median_ms": median(times[e]) * 1e3, "first_s": first[e]} for e in engines}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--models", default="llama,mixtral")
    parser.add_argument("--engines", default="eager,inductor,cuvil")
    args = parser.parse_args(argv)
    import torch
    import cuvil
    torch.set_num_threads(1)
    cuvil.runtime.set_num_threads(1)
    warnings.filterwarnings("ignore", category=FutureWarning)
    engines = args.engines.split(",")
    if "eager" in engines:      # eager's tokens are the reference: its run comes first
        engines = ["eager"] + [e for e in engines if e != "eager"]
    print(f"| model | {' | '.join(engines)} |\n|---|{'---|' * len(engines)}")
    for name in args.models.split(","):
        result = run(name, engines, args.runs)
        eager = result.get("eager", {}).get("median_ms")
        cells = [f"{r['median_ms']:.0f} ms" + (f" ({eager / r['median_ms']:.2f}x)" if eager else "")
                 + f", first {r['first_s']:.1f} s" for r in result.values()]
        print(f"| {name} | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()
