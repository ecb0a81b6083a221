"""The pass infrastructure: registry, pipeline strings, the manager, preconditions and instruments."""
from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Literal

import pytest
import torch

from cuvil.errors import CuvilPassError, CuvilPipelineError, CuvilVerifyError
from cuvil.ir import Builder, DType, Function, Module, TensorType, interpret, print_module, sym
from cuvil.passes import (Instrument, IRSnapshot, ModulePass, NumericCheck, PassManager, PassTiming, Pipeline,
                          PrintIR, VerifyEach, all_passes, get_pass, parse_pipeline, register_pass,
                          register_pipeline, unregister_pass)
from cuvil.passes import registry

F32 = DType.f32


def make_module() -> Module:
    """forward(x: s0x4) = (relu(relu(x)) + w) * 1, with s0 in [1, 16] and w a 4-vector constant."""
    m = Module(constants={"w": torch.linspace(-1.0, 1.0, 4)})
    fn = m.add_function(Function("forward", [TensorType(F32, (sym("s0"), 4))], ["x"], symbols={"s0": (1, 16)}))
    b = Builder(fn)
    w = b.create("cuvil.const", attrs={"name": "w"}, result_types=[TensorType(F32, (4,))]).result
    r = b("cuvil.relu", b("cuvil.relu", fn.args[0]))
    one = b("cuvil.literal", value=1.0, dtype=F32)
    out = b("cuvil.mul", b("cuvil.add", r, w), one)
    b.create("cuvil.return", [out])
    return m


def op_names(m: Module) -> list[str]:
    return [op.name for op in m.main.ops]


@pytest.fixture
def scratch_passes():
    """Names registered during a test are unregistered afterwards."""
    before = set(registry._PASSES)
    yield
    for name in set(registry._PASSES) - before:
        unregister_pass(name)


# ----------------------------------------------------------------------------- registry

def test_builtin_passes_are_registered_by_name():
    passes = all_passes()
    for name in ("verify", "shape-infer", "canonicalize", "cse", "dce"):
        assert passes[name].name == name
        assert passes[name].summary()
    assert get_pass("no-such-pass") is None


@register_pass
@dataclass(frozen=True)
class _TypedOptions(ModulePass):
    """A pass with one option of every supported type (it does nothing)."""
    name = "test-typed-options"
    count: int = 1
    scale: float = 0.5
    flag: bool = False
    label: str = "a"
    keep: tuple[str, ...] = ()
    sizes: tuple[int, ...] = (1, 2)
    mode: Literal["fast", "exact"] = "fast"
    limit: int | None = None

    def run(self, module):
        return False


def test_class_pass_options_parse_from_a_pipeline_string():
    (p,) = parse_pipeline('test-typed-options{count=0x10 scale=2.5e-1 flag=true label="x y" keep=a,b.c '
                          'sizes=3,4,5 mode=exact limit=none}').passes
    assert p == _TypedOptions(count=16, scale=0.25, flag=True, label="x y", keep=("a", "b.c"), sizes=(3, 4, 5),
                              mode="exact", limit=None)
    (q,) = parse_pipeline("test-typed-options{flag limit=7 keep=}").passes
    assert (q.flag, q.limit, q.keep) == (True, 7, ())


def test_canonical_pipeline_string_round_trips():
    text = 'canonicalize{fold-constants=false} , cse{aggressive=true},test-typed-options{label="x y" sizes=7,8}'
    p = parse_pipeline(text)
    canonical = str(p)
    assert canonical == 'canonicalize{fold-constants=false},cse{aggressive=true},test-typed-options{label="x y" sizes=7,8}'
    assert parse_pipeline(canonical) == p
    assert str(parse_pipeline("cse{aggressive=false}")) == "cse"        # defaults are left out
    assert p.spec(include_defaults=True).startswith("canonicalize{fold-constants=false},cse{aggressive=true},"
                                                    "test-typed-options{count=1 scale=0.5 flag=false")


def test_function_pass_with_options(scratch_passes):
    seen = []

    @register_pass("test-fn-pass", requires={"verified"}, priority=7)
    def test_fn_pass(module, factor: float = 2.0, tag: str = "t"):
        """Record the options it was run with."""
        seen.append((factor, tag))
        return {"calls": len(seen)}

    cls = get_pass("test-fn-pass")
    assert cls.priority == 7 and cls.requires == {"verified"} and cls.summary() == "Record the options it was run with."
    records = PassManager("verify,test-fn-pass{factor=3 tag=u}").run(make_module())
    assert seen == [(3.0, "u")]
    assert records[1].statistics == {"calls": 1} and records[1].options == {"factor": 3.0, "tag": "u"}
    assert records[1].spec == "test-fn-pass{factor=3.0 tag=u}"


def test_duplicate_names_are_refused_but_redefinition_replaces(scratch_passes):
    def make(doc):
        @dataclass(frozen=True)
        class Twice(ModulePass):
            name = "test-twice"

            def run(self, module):
                return False
        Twice.__doc__ = doc
        return Twice

    first, again = make("first"), make("again")       # same module and qualname: a re-run notebook cell
    register_pass(first)
    register_pass(again)
    assert get_pass("test-twice") is again

    @dataclass(frozen=True)
    class Other(ModulePass):
        name = "test-twice"
    with pytest.raises(ValueError, match="pass 'test-twice' is already registered by .*make.<locals>.Twice"):
        register_pass(Other)
    register_pass(Other, replace=True)
    assert get_pass("test-twice") is Other

    @dataclass(frozen=True)
    class Shadow(ModulePass):
        name = "cse"
    with pytest.raises(ValueError, match="'cse' is a built-in pass"):
        register_pass(Shadow)


def test_malformed_pass_classes_are_refused(scratch_passes):
    class NotDataclass(ModulePass):
        name = "test-not-dataclass"
    with pytest.raises(TypeError, match="@dataclass\\(frozen=True\\)"):
        register_pass(NotDataclass)

    @dataclass(frozen=True)
    class BadName(ModulePass):
        name = "Bad_Name"
    with pytest.raises(ValueError, match="kebab-case"):
        register_pass(BadName)

    with pytest.raises(TypeError, match="needs a default"):
        register_pass("test-no-default")(lambda module, k: None)


@pytest.fixture
def scratch_pipelines():
    before = dict(registry._PIPELINES)
    yield
    registry._PIPELINES.clear()
    registry._PIPELINES.update(before)


def test_named_pipelines_expand_and_refuse_cycles(scratch_pipelines):
    assert str(parse_pipeline("O1")) == "verify,shape-infer,canonicalize,cse,dce,fuse"
    register_pipeline("test-pipe", "O0,cse{aggressive=true}")
    assert str(parse_pipeline("test-pipe,dce")) == "verify,shape-infer,cse{aggressive=true},dce"
    with pytest.raises(CuvilPipelineError, match="named pipeline 'test-bad': .*unknown pass 'nope'"):
        register_pipeline("test-bad", "verify,nope")
    register_pipeline("test-loop", "verify")
    registry._PIPELINES["test-loop"] = "cse,test-loop"     # what replace=True with a cycle would leave
    with pytest.raises(CuvilPipelineError, match="named pipeline 'test-loop' includes itself"):
        parse_pipeline("test-loop")
    with pytest.raises(CuvilPipelineError, match="named pipeline 'O1' takes no options"):
        parse_pipeline("O1{x=1}")


@pytest.mark.parametrize("text, column, message", [
    ("canonicalise", 1, "unknown pass 'canonicalise' (did you mean 'canonicalize'?)"),
    ("cse,xyzzy", 5, "unknown pass 'xyzzy'"),
    ("cse{aggresive=true}", 5, "unknown option 'aggresive' for pass 'cse' (did you mean 'aggressive'? "
                               "valid options: aggressive)"),
    ("dce{x=1}", 5, "unknown option 'x' for pass 'dce' (valid options: none)"),
    ("cse{aggressive=maybe}", 16, "option 'aggressive' of pass 'cse': expected true or false, got 'maybe'"),
    ("test-typed-options{count=many}", 26, "option 'count' of pass 'test-typed-options': expected an integer"),
    ("test-typed-options{scale=x}", 26, "option 'scale' of pass 'test-typed-options': expected a number"),
    ("test-typed-options{sizes=1,b}", 26, "expected an integer, got 'b'"),
    ("test-typed-options{mode=slow}", 25, "expected one of fast, exact, got 'slow'"),
    ("test-typed-options{count}", 20, "option 'count' of pass 'test-typed-options': needs a value (int)"),
    ("cse{aggressive=true", 4, "unbalanced '{' in the options of 'cse' (missing '}')"),
    ("cse},dce", 4, "unbalanced '}' (no matching '{')"),
    ("cse,,dce", 5, "expected a pass name, got ','"),
    ("cse,", 5, "expected a pass name after ','"),
    ("cse dce", 5, "expected ',' between passes, got 'd'"),
    ("cse{aggressive=true aggressive=false}", 21, "option 'aggressive' of pass 'cse' is given twice"),
    ('test-typed-options{label="abc}', 26, "unterminated string"),
    ("cse{aggressive=}", 16, "option 'aggressive' of pass 'cse': expected true or false, got ''"),
])
def test_pipeline_errors_name_the_problem_and_column(text, column, message):
    with pytest.raises(CuvilPipelineError) as info:
        parse_pipeline(text)
    err = info.value
    assert message in str(err)
    assert err.column == column and err.pipeline == text
    caret_line = str(err).splitlines()[-1]
    assert caret_line.index("^") - 2 == column - 1      # the caret sits under the column


def test_missing_required_option_is_named(scratch_passes):
    @register_pass
    @dataclass(frozen=True)
    class NeedsOption(ModulePass):
        name = "test-needs-option"
        size: int

    with pytest.raises(CuvilPipelineError, match="pass 'test-needs-option': missing required option\\(s\\) size"):
        parse_pipeline("cse,test-needs-option")
    assert parse_pipeline("test-needs-option{size=3}").passes[0].size == 3


def test_insert_by_priority_places_a_user_pass():
    @dataclass(frozen=True)
    class Middle(ModulePass):
        name = "test-middle"
        priority = 105

    p = parse_pipeline("O1").insert_by_priority(Middle())
    assert str(p) == "verify,shape-infer,canonicalize,test-middle,cse,dce,fuse"
    assert str(Pipeline.of(["cse", Middle(), "dce"])) == "cse,test-middle,dce"


# ----------------------------------------------------------------------------- the manager

def test_records_describe_every_pass_and_serialise_to_json():
    m = make_module()
    records = PassManager("verify,canonicalize,cse", instruments=[IRSnapshot()]).run(m)
    assert [r.name for r in records] == ["verify", "canonicalize", "cse"]
    verify_rec, canon, cse = records
    assert not verify_rec.changed and canon.changed and not cse.changed
    assert canon.statistics == {"mul-one": 1, "relu-relu": 1}
    assert canon.ir_before.count("cuvil.relu") == 2 and canon.ir_after.count("cuvil.relu") == 1
    assert "cuvil.mul" not in canon.ir_after and canon.ir_after == print_module(m)
    assert cse.ir_before == cse.ir_after == canon.ir_after
    data = json.loads(json.dumps([r.to_json() for r in records]))
    assert data[1]["name"] == "canonicalize" and data[1]["changed"] is True and data[1]["skipped"] is None
    assert set(data[0]) == {"name", "options", "spec", "changed", "time_s", "statistics", "skipped",
                            "ir_before", "ir_after", "checks", "stage"}


def test_change_detection_does_not_trust_the_pass(scratch_passes):
    @register_pass("test-same-type")
    def same_type(module):
        module.main.args[0].type = TensorType(F32, (sym("s0"), 4))   # the type it already had

    @register_pass("test-new-weights")
    def new_weights(module):
        module.constants["w"] = module.constants["w"] * 2           # same name, new data

    @register_pass("test-liar")
    def liar(module):
        module.main.ops[1].attrs["extra"] = 1
        return False

    assert PassManager("test-same-type").run(make_module())[0].changed is False
    assert PassManager("test-new-weights").run(make_module())[0].changed is True
    with pytest.raises(CuvilPassError, match="pass 'test-liar' reported no change but changed the IR"):
        PassManager("test-liar").run(make_module())


def test_when_predicate_skips_and_instruments_see_it(scratch_passes):
    @register_pass
    @dataclass(frozen=True)
    class OnlyWithConv(ModulePass):
        name = "test-only-with-conv"

        def when(self, module):
            return any(op.name == "cuvil.conv2d" for op in module.main.ops)

        def run(self, module):
            raise AssertionError("must not run")

    log = []

    class Log(Instrument):
        def skipped(self, p, module, record):
            log.append(("skipped", p.name, record.skipped))

        def before(self, p, module):
            log.append(("before", p.name))

    records = PassManager("test-only-with-conv,dce", instruments=[Log()], assume={"verified"}).run(make_module())
    assert records[0].skipped == "when=False" and records[1].skipped is None
    assert log == [("skipped", "test-only-with-conv", "when=False"), ("before", "dce")]


def test_should_run_skips_a_pass_and_hooks_nest():
    calls = []

    class Tracer(Instrument):
        def __init__(self, tag):
            self.tag = tag

        def run_start(self, module, pipeline):
            calls.append((self.tag, "start", pipeline))

        def should_run(self, p, module):
            return p.name != "cse"

        def before(self, p, module):
            calls.append((self.tag, "before", p.name))

        def after(self, p, module, record):
            calls.append((self.tag, "after", p.name, record.changed))

        def run_end(self, module, records):
            calls.append((self.tag, "end", len(records)))

    records = PassManager("verify,cse,canonicalize", instruments=[Tracer("a"), Tracer("b")]).run(make_module())
    assert records[1].skipped == "instrument Tracer"
    assert calls == [
        ("a", "start", "verify,cse,canonicalize"), ("b", "start", "verify,cse,canonicalize"),
        ("a", "before", "verify"), ("b", "before", "verify"), ("b", "after", "verify", False),
        ("a", "after", "verify", False),
        ("a", "before", "canonicalize"), ("b", "before", "canonicalize"), ("b", "after", "canonicalize", True),
        ("a", "after", "canonicalize", True),
        ("a", "end", 3), ("b", "end", 3),
    ]


def test_preconditions_are_enforced(scratch_passes):
    # The manager verifies its input first, so 'verified' holds at the start ...
    assert PassManager("cse").run(make_module())[0].skipped is None
    bad = make_module()
    ops = bad.main.ops
    ops[1], ops[2] = ops[2], ops[1]            # the outer relu now comes before the inner one
    with pytest.raises(CuvilVerifyError, match="used before it is defined"):
        PassManager("cse").run(bad)

    @register_pass("test-breaks-verified", invalidates={"verified"})
    def breaks(module):
        return None

    with pytest.raises(CuvilPassError, match="pass 'dce' requires 'verified'"):
        PassManager("verify,test-breaks-verified,dce").run(make_module())

    @register_pass("test-needs-magic", requires={"magic"})
    def needs(module):
        return None

    with pytest.raises(CuvilPassError, match="requires 'magic', .*no registered pass provides it"):
        PassManager("test-needs-magic").run(make_module())


def test_a_crashing_pass_is_named(scratch_passes):
    @register_pass("test-crash")
    def crash(module):
        raise KeyError("boom")

    failed = []

    class Watch(Instrument):
        def after_failed(self, p, module, error):
            failed.append((p.name, type(error).__name__))

    with pytest.raises(CuvilPassError, match="pass 'test-crash' failed: KeyError: 'boom'") as info:
        PassManager("test-crash", instruments=[Watch()]).run(make_module())
    assert isinstance(info.value.__cause__, KeyError) and info.value.pass_name == "test-crash"
    assert failed == [("test-crash", "KeyError")]


# ----------------------------------------------------------------------------- instruments

def test_verify_each_names_the_pass_that_broke_the_ir(scratch_passes):
    @register_pass("test-break-types")
    def break_types(module):
        relu = next(op for op in module.main.ops if op.name == "cuvil.relu")
        relu.result.type = TensorType(DType.i32, relu.result.type.shape)

    with pytest.raises(CuvilPassError, match="pass 'test-break-types' left invalid IR: result 0 has type "
                                             "tensor<s0x4xi32> but its operands give tensor<s0x4xf32>"):
        PassManager("canonicalize,test-break-types,dce", instruments=[VerifyEach()],
                    assume={"verified"}).run(make_module())

    bad = make_module()
    bad.main.ops.pop(0)   # the const that the add uses
    with pytest.raises(CuvilVerifyError, match="the input to the pipeline is invalid"):
        PassManager("dce", instruments=[VerifyEach()], assume={"verified"}).run(bad)


@register_pass("test-add-to-sub")
def _add_to_sub(module):
    """Deliberately wrong: turns every add into a sub."""
    from cuvil.ir import lookup_op
    for op in module.main.ops:
        if op.name == "cuvil.add":
            op.opdef = lookup_op("cuvil.sub")


def test_numeric_check_names_the_first_pass_that_changed_results():
    check = NumericCheck(rtol=1e-6, atol=1e-6)
    with pytest.raises(CuvilPassError, match="pass 'test-add-to-sub' changed the results: result 0 differs by "
                                             "up to .* \\(rtol=1e-06, atol=1e-06\\)") as info:
        PassManager("verify,canonicalize,test-add-to-sub,cse", instruments=[check]).run(make_module())
    assert info.value.pass_name == "test-add-to-sub"

    quiet = NumericCheck(raise_on_mismatch=False)
    records = PassManager("verify,canonicalize,test-add-to-sub,canonicalize,cse", instruments=[quiet]).run(make_module())
    assert quiet.first_failure == "test-add-to-sub"
    assert records[1].checks["numeric"] == {"max_abs_err": 0.0, "ok": True}
    assert records[2].checks["numeric"]["ok"] is False and records[2].checks["numeric"]["max_abs_err"] > 0.5
    assert "numeric" not in records[0].checks       # verify changed nothing, so nothing was re-run


def test_numeric_check_uses_given_inputs_and_symbol_values():
    x = torch.tensor([[-1.0, 2.0, -3.0, 4.0]] * 5)
    check = NumericCheck(inputs=[x])
    m = make_module()
    (expected,) = interpret(m, x)
    PassManager("O1", instruments=[check]).run(m)
    assert torch.equal(interpret(m, x)[0], expected)
    sized = NumericCheck(symbol_values={"s0": 7})
    sized.run_start(make_module(), "")
    assert sized.inputs[0].shape == (7, 4)


def test_print_ir_and_timing_instruments_write_to_their_stream():
    out = io.StringIO()
    PassManager("verify,canonicalize,cse", instruments=[PrintIR(after_change=True, stream=out)]).run(make_module())
    text = out.getvalue()
    assert text.count("// -----// IR Dump After") == 1
    assert text.startswith("// -----// IR Dump After canonicalize //----- //\ncuvil.func @forward")

    out = io.StringIO()
    PassManager("verify,cse{aggressive=true}", instruments=[PrintIR(before_all=True, after_all=True, stream=out)]
                ).run(make_module())
    headers = [line for line in out.getvalue().splitlines() if line.startswith("// -----//")]
    assert headers == ["// -----// IR Dump Before verify //----- //", "// -----// IR Dump After verify //----- //",
                       "// -----// IR Dump Before cse{aggressive=true} //----- //",
                       "// -----// IR Dump After cse{aggressive=true} //----- //"]

    out = io.StringIO()
    PassManager("verify,dce", instruments=[PassTiming(stream=out)]).run(make_module())
    lines = out.getvalue().splitlines()
    assert "Pass execution timing report" in lines[1]
    assert [line.split()[-1] for line in lines[-2:]] == ["verify", "dce"]


def test_cuvil_debug_levels(monkeypatch, capsys):
    monkeypatch.setenv("CUVIL_DEBUG", "1")
    PassManager("verify,canonicalize").run(make_module())
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "[cuvil] pipeline: verify,canonicalize"
    assert err[1].startswith("[cuvil] pass verify: unchanged")
    assert err[2].startswith("[cuvil] pass canonicalize: changed") and err[2].endswith("mul-one=1 relu-relu=1")

    monkeypatch.setenv("CUVIL_DEBUG", "5")
    PassManager("verify,canonicalize").run(make_module())
    err = capsys.readouterr().err
    assert "IR Dump After verify" in err and "IR Dump After canonicalize" in err

    monkeypatch.setenv("CUVIL_DEBUG", "4")
    PassManager("verify,canonicalize").run(make_module())
    err = capsys.readouterr().err
    assert "IR Dump After verify" not in err and "IR Dump After canonicalize" in err
