"""`precision="bf16"/"fp16"` (the mixed-precision pass) against eager PyTorch under torch.autocast:
the compiled models agree with autocast to within a couple of low-precision rounding steps of
the output's scale, while they differ from fp32 eager by far more than fp32 Cuvil does."""
import pytest
import torch

import cuvil
from cuvil import zoo
from cuvil.errors import CuvilError

LOW = {"bf16": (torch.bfloat16, 2.0 ** -8), "fp16": (torch.float16, 2.0 ** -11)}   # dtype, unit roundoff


@pytest.fixture(scope="module", autouse=True)
def _private_cache_dir(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("CUVIL_CACHE_DIR", str(tmp_path_factory.mktemp("cuvil-cache")))
        yield


def max_err(a, b) -> float:
    return (a.double() - b.double()).abs().max().item()


@pytest.mark.parametrize("name,precision", [("mlp", "bf16"), ("cnn", "bf16"), ("transformer", "bf16"),
                                            ("mlp", "fp16")])
def test_low_precision_matches_autocast(name, precision):
    entry = zoo.get(name)
    dtype, unit = LOW[precision]
    inputs = entry.inputs(batch=2)
    low = cuvil.compile(entry.model, precision=precision)(*inputs)
    full = cuvil.compile(entry.model)(*inputs)
    with torch.no_grad():
        eager = entry.model(*inputs)
        with torch.autocast("cpu", dtype=dtype):
            autocast = entry.model(*inputs)
    scale = eager.abs().max().item()
    assert max_err(low, autocast) <= 4 * unit * scale          # a few roundings of the output apart
    assert max_err(low, eager) > 100 * max(max_err(full, eager), 1e-7)   # low precision did happen
    assert max_err(low, eager) <= 16 * unit * scale


def test_statistics_count_the_mlp_ops_by_policy():
    entry = zoo.get("mlp")
    report = cuvil.explain(entry.model, *entry.example_inputs, precision="bf16", native=False)
    (record,) = [p for p in report.passes if p["name"] == "mixed-precision"]
    # three linears: weight, bias and result rounded, the first one's input x too (the others get
    # a relu's rounded result), and two relus on low values: 4 + 1 + 3 + 1 + 3 roundings
    assert record["statistics"] == {"always": 3, "follow": 2, "roundings": 12}
    assert record["options"] == {"dtype": "bf16"}


def test_fp32_adds_no_pass_and_a_bad_precision_is_named():
    entry = zoo.get("mlp")
    report = cuvil.explain(entry.model, *entry.example_inputs, native=False)
    assert "mixed-precision" not in [p["name"] for p in report.passes]
    with pytest.raises(CuvilError, match="precision must be one of fp32, bf16, fp16, not 'int8'"):
        cuvil.compile(entry.model, precision="int8")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_model_in_half_precision_runs_its_gemms_in_f32_and_rounds_once(dtype):
    # torch's CPU convolutions and linears in f16/bf16 accumulate in f32 and round the result: so
    # does Cuvil (whose GEMMs are f32), which used to refuse such a model
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 8, 3, groups=8, padding=1), torch.nn.Flatten(),
                                torch.nn.Linear(8 * 8 * 8, 16)).to(dtype).eval()
    x = torch.randn(2, 3, 8, 8, dtype=dtype)
    got = cuvil.compile(model)(x)
    assert got.dtype == dtype
    torch.testing.assert_close(got, model(x), rtol=0, atol=0)
    q, k, v = (torch.randn(1, 2, 9, 16, dtype=dtype) for _ in range(3))
    attention = cuvil.compile(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v) @ v.transpose(-1, -2))
    reference = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double()) @ v.double().transpose(-1, -2)
    eager = torch.nn.functional.scaled_dot_product_attention(q, k, v) @ v.transpose(-1, -2)
    assert max_err(attention(q, k, v), reference) <= 2 * max_err(eager, reference)
