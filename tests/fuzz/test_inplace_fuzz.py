"""Fuzzing the import of in-place ops (frontend/inplace.py): generated functions that make tensors,
take views of them, change them in place (`add_`, `relu_`, `copy_`, `+=`, `masked_fill_`, writes
through slices and selections, ...) and read them before and after. The oracle is eager PyTorch on the same inputs: every output equal in
dtype, shape and value (the rewrite must never read a tensor as it was before a change someone
could see), or a CuvilError (Cuvil refuses changes to the function's own inputs)."""
from __future__ import annotations

import random

import torch
from conftest import SCALE
from hypothesis import given, settings
from hypothesis import strategies as st

import cuvil

FRESH = ["x @ w", "x * 2", "x.clone()", "torch.relu(x)", "x + y", "(x @ w).half()"]
VIEWS = ["{v}[0]", "{v}.view(-1)", "{v}.t()", "{v}[:, 1:]", "{v}.reshape(3, 3)", "{v}.unsqueeze(0)",
         "{v}.transpose(0, 1)"]
INPLACE = ["{v}.add_(y)", "{v}.mul_(2)", "{v}.relu_()", "{v}.sub_(1.5)", "{v}.clamp_(-1, 1)", "{v}.copy_(y)",
           "{v}.add_(1)", "{v}.div_(3)", "{v}.sigmoid_()", "{v} += x", "{v}.masked_fill_(x > 0, 0.25)",
           # writes through slices and selections (frontend/inplace.py's put-back views)
           "{v}[0] += y[0]", "{v}[:, 1:] = x[:, :2]", "{v}[1:].mul_(2)", "{v}[0, 1:] = 0.5", "{v}[:2, 1] *= w[0, 0]"]
READS = ["{v}.sum()", "{v} * 1", "{v}.exp()", "({v} @ w)"]


def program(seed: int) -> str:
    """A function of x, y, w [3, 3]: a few tensors made, viewed, changed in place and read."""
    rng = random.Random(seed)
    lines, names = [], ["x"]
    for _ in range(rng.randint(2, 7)):
        kind = rng.random()
        name = f"t{len(names)}"
        if kind < 0.25:
            lines.append(f"{name} = {rng.choice(FRESH)}")
        elif kind < 0.45:   # mostly views of tensors the function made: the ones a change shows through
            lines.append(f"{name} = " + rng.choice(VIEWS).format(v=rng.choice(names[1:] or names)))
        elif kind < 0.8:
            if len(names) > 1:
                lines.append(rng.choice(INPLACE).format(v=rng.choice(names[1:])))
            continue
        else:
            lines.append(f"{name} = " + rng.choice(READS).format(v=rng.choice(names)))
        names.append(name)
    returned = rng.sample(names, min(len(names), rng.randint(1, 3)))
    lines.append("return " + ", ".join(f"{n} * 1" for n in returned) + ",")
    return "def f(x, y, w):\n" + "\n".join("    " + line for line in lines)


@settings(settings.get_profile("cuvil-fuzz"), max_examples=80 * SCALE)
@given(st.integers(0, 2**32 - 1))
def test_inplace_programs_match_eager(seed):
    source = program(seed)
    scope = {"torch": torch}
    exec(source, scope)
    f = scope["f"]
    g = torch.Generator().manual_seed(seed)
    x, y, w = (torch.randn(3, 3, generator=g) for _ in range(3))
    try:
        want = f(x.clone(), y.clone(), w.clone())
    except (RuntimeError, IndexError):   # not a program torch runs (a view changed where it may not be,
        return                            # an index into a 0-d sum)
    try:
        got = cuvil.compile(f, cache=False)(x.clone(), y.clone(), w.clone())
    except cuvil.CuvilError:
        return
    for g_, w_ in zip(got, want, strict=True):
        assert g_.dtype == w_.dtype and g_.shape == w_.shape, source
        torch.testing.assert_close(g_, w_, rtol=1e-3, atol=1e-3, equal_nan=True, msg=source)
