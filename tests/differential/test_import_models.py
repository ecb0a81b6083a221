"""Zoo models imported through torch.export: the IR verifies, round-trips through text, and the
reference interpreter matches eager PyTorch at the export sizes and at other dynamic sizes."""
import functools
import os

import pytest
import torch

from cuvil import ir, zoo
from cuvil.frontend import import_model

# other sizes for the dynamic dims: 1 (below the export example) and odd sizes above it
OTHER_SIZES = {"batch": (1, 3), "seq": (5, 17)}


@functools.lru_cache(maxsize=None)
def imported(name):
    entry = zoo.get(name)
    return entry, import_model(entry.model, entry.example_inputs, entry.dynamic, ranges=entry.ranges)


def eager(entry, inputs):
    with torch.no_grad():
        return entry.model(*inputs)


def assert_matches_eager(entry, result, inputs):
    got = result.unflatten(ir.interpret(result.module, *inputs))
    want = eager(entry, inputs)
    assert type(got) is type(want)
    torch.testing.assert_close(dict(got) if hasattr(want, "keys") else got,
                               dict(want) if hasattr(want, "keys") else want)


MODELS = zoo.names()


@pytest.mark.parametrize("name", MODELS)
def test_verifies_and_round_trips(name):
    _, result = imported(name)
    ir.verify(result.module)
    text = ir.print_module(result.module)
    again = ir.parse(text)
    ir.verify(again)
    assert ir.print_module(again) == text


@pytest.mark.parametrize("name", MODELS)
def test_matches_eager_at_export_sizes(name):
    entry, result = imported(name)
    assert_matches_eager(entry, result, entry.example_inputs)


@pytest.mark.parametrize("name", MODELS)
def test_matches_eager_at_other_dynamic_sizes(name):
    entry, result = imported(name)
    dims = list(entry.example_sizes)
    for i in range(2):
        sizes = {d: OTHER_SIZES[d][i] for d in dims}
        assert_matches_eager(entry, result, entry.inputs(**sizes))


@pytest.mark.parametrize("name", MODELS)
def test_dynamic_dims_are_symbols_with_ranges(name):
    entry, result = imported(name)
    fn = result.function
    hints = sorted({n for h in entry.dynamic for n in h.values()})
    assert sorted(s.hint for s in result.symbols.values()) == hints
    for hint in hints:
        symbol = result.symbol_for(hint)
        assert fn.symbols[symbol] == entry.ranges[hint]
    # every dynamic axis of every input is its hint's symbol; the other axes are the example's sizes
    for arg, hint, example in zip(fn.args, entry.dynamic, entry.example_inputs):
        for axis, dim in enumerate(arg.type.shape):
            if axis in hint:
                assert str(dim) == result.symbol_for(hint[axis])
            else:
                assert dim == example.shape[axis]


@pytest.mark.parametrize("name", MODELS)
def test_constants_are_the_model_weights(name):
    entry, result = imported(name)
    state = {**dict(entry.model.named_parameters()), **dict(entry.model.named_buffers())}
    used = {op.attrs["name"] for op in result.function.ops if op.name == "cuvil.const"}
    assert used == set(result.module.constants)
    assert used, "a model without weights?"
    for const in used:
        assert torch.equal(result.module.constants[const], state[const].detach()), const


@pytest.mark.parametrize("name", MODELS)
def test_compute_ops_carry_source_locations(name):
    _, result = imported(name)
    compute = [op for op in result.function.ops if op.name in ("cuvil.linear", "cuvil.conv2d", "cuvil.sdpa")]
    assert compute
    for op in compute:
        assert op.loc is not None, op
        assert os.path.exists(op.loc.file) and "/torch/" not in op.loc.file, op.loc


def test_hugging_face_outputs_keep_their_structure():
    entry, result = imported("bert")
    out = result.unflatten(ir.interpret(result.module, *entry.example_inputs))
    assert type(out).__name__ == "BaseModelOutputWithPoolingAndCrossAttentions"
    assert out.last_hidden_state.shape == (2, 16, 64) and out.pooler_output.shape == (2, 64)


def test_bert_padding_mask_changes_the_result():
    """The attention mask is a real input: flipping it must change the output, as in eager."""
    entry, result = imported("bert")
    ids, mask = entry.example_inputs
    full = torch.ones_like(mask)
    a = ir.interpret(result.module, ids, mask)[0]
    b = ir.interpret(result.module, ids, full)[0]
    assert not torch.allclose(a, b)
    torch.testing.assert_close(b, eager(entry, (ids, full)).last_hidden_state)
