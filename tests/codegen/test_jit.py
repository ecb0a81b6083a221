"""Target machines, the object cache, de-duplication of identical kernels, the per-kernel LLVM IR and
assembly, cross-compilation, and the kernel ABI as the native engine calls it."""
import re

import pytest
import torch

from cuvil.codegen import jit as jit_module
from cuvil.codegen.cache import ObjectCache, cache_key
from cuvil.codegen.call import call_kernel
from cuvil.codegen.jit import compile_function, compile_kernels
from cuvil.codegen.kernel_text import parse_kernels, print_kernel
from cuvil.codegen.target import Target
from cuvil.errors import CuvilError

from codegen_helpers import Graph, T, run

ADD_RELU = """\
kernel @add_relu(%a: in f32[s0, 512], %b: in f32[512], %out: out f32[s0, 512]) dims(s0) {
  parallel for i0 in 0..s0 {
    for i1 in 0..512 {
      %out[i0, i1] = max(add(%a[i0, i1], %b[i1]), 0.0:f32)
    }
  }
}
"""
TOTAL = """\
kernel @total(%x: in f32[s0], %out: out f32[1]) dims(s0) {
  %s = reduce sum(0.0:f32) for i in 0..s0 {
    yield mul(%x[i], %x[i])
  }
  %out[0] = %s
}
"""


def test_host_target_and_cross_presets():
    host = Target.host()
    assert host.is_host and host.cpu and host.features.startswith(("+", "-"))
    arm = Target.cross("aarch64")
    assert not arm.is_host and arm.arch == "aarch64"
    with pytest.raises(CuvilError, match="unknown cross target 'sparc'"):
        Target.cross("sparc")


def test_cache_hit_skips_llvm_and_runs(tmp_path, monkeypatch):
    cache = ObjectCache(tmp_path)
    first = compile_kernels(parse_kernels(ADD_RELU), cache=cache)
    assert not first.cache_hit and (cache.hits, cache.misses) == (0, 1)
    assert {"llvm_ir", "optimize", "codegen", "load"} <= set(first.timings)

    def no_llvm(*args, **kw):
        raise AssertionError("a cache hit must not optimise or emit code")
    monkeypatch.setattr(jit_module, "optimize", no_llvm)
    monkeypatch.setattr(jit_module, "build_module", no_llvm)
    second = compile_kernels(parse_kernels(ADD_RELU.replace("@add_relu", "@renamed")), cache=cache)
    assert second.cache_hit and (cache.hits, cache.misses) == (1, 1)
    assert "optimize" not in second.timings and second.key == first.key
    a, b = torch.randn(3, 512), torch.randn(512)
    out = torch.empty(3, 512)
    call_kernel(second, "renamed", [a, b, out])
    torch.testing.assert_close(out, torch.relu(a + b))
    assert "@cuvil_k_" in second.llvm_ir("renamed")         # the IR text comes from the cache too


def test_a_model_that_misses_compiles_only_the_modules_the_cache_lacks(tmp_path, monkeypatch):
    cache = ObjectCache(tmp_path)
    compile_kernels(parse_kernels(ADD_RELU + TOTAL), cache=cache)
    compiled = []
    real = jit_module.llvm_compile.compile_texts

    def spy(**task):
        compiled.extend(task["texts"])
        return real(**task)
    monkeypatch.setattr(jit_module.llvm_compile, "compile_texts", spy)
    abs_sum = TOTAL.replace("mul(%x[i], %x[i])", "abs(%x[i])")
    second = compile_kernels(parse_kernels(ADD_RELU + abs_sum), cache=cache)
    assert not second.cache_hit and cache.units_reused == 1
    [text] = compiled                                        # only the new kernel's module went to LLVM
    assert second.symbols["total"] in text and second.symbols["add_relu"] not in text
    a, b, x = torch.randn(3, 512), torch.randn(512), torch.randn(1000)
    out, total = torch.empty(3, 512), torch.empty(1)
    call_kernel(second, "add_relu", [a, b, out], {"s0": 3})      # the object from the first model
    call_kernel(second, "total", [x, total], {"s0": 1000})
    torch.testing.assert_close(out, torch.relu(a + b))
    torch.testing.assert_close(total, x.double().abs().sum().float().reshape(1))
    assert "@cuvil_k_" in second.llvm_ir("add_relu")        # its IR text comes from the cache too

    compiled.clear()
    third = compile_kernels(parse_kernels(ADD_RELU + abs_sum), cache=cache)
    assert third.cache_hit and compiled == [] and third.objects == second.objects


def test_the_shown_assembly_is_kept_with_the_module(tmp_path, monkeypatch):
    cache = ObjectCache(tmp_path)
    first = compile_kernels(parse_kernels(ADD_RELU + TOTAL), cache=cache)
    shown = first.asm("add_relu")
    assert shown.startswith(first.symbols["add_relu"] + ":") and len(list(tmp_path.glob("*/*.s"))) == 2  # per module

    def no_codegen(*args, **kw):
        raise AssertionError("the assembly should come from the cache")
    monkeypatch.setattr(jit_module, "emit", no_codegen)
    again = compile_kernels(parse_kernels(ADD_RELU + TOTAL), cache=cache)
    assert again.asm("add_relu") == shown and again.asm("total") == first.asm("total")
    assert again.op_lines("add_relu") == first.op_lines("add_relu")


def test_models_of_other_sizes_share_the_compiled_gemm_routine(tmp_path, monkeypatch):
    import cuvil
    from cuvil.codegen import workers
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(workers, "_pool", workers.Pool(0))
    compiled = []
    real = jit_module.llvm_compile.compile_texts

    def spy(**task):
        compiled.extend(re.search(r'^define [^@]*@"?([\w.]+)', t, re.M)[1] for t in task["texts"])
        return real(**task)
    monkeypatch.setattr(jit_module.llvm_compile, "compile_texts", spy)

    def mlp(a, b):
        return torch.nn.Sequential(torch.nn.Linear(a, b), torch.nn.ReLU(), torch.nn.Linear(b, a), torch.nn.ReLU())
    runs = []
    # 48 and 24 rows: whole blocks of the microkernel's rows (6 with AVX-512's 64-wide panels and
    # with AVX2's 16-wide ones), so both need the routine with the same row blocks
    # (`panel_gemm.row_blocks`); 64 and 128 columns take panels of one width (`panel_width`)
    for model, x in ((mlp(64, 128), torch.randn(48, 64)), (mlp(128, 64), torch.randn(24, 128))):
        compiled.clear()
        got = cuvil.compile(model, cache="objects")(x)
        with torch.no_grad():
            torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-5)
        runs.append(list(compiled))
    # both GEMMs of the first model call one routine, compiled in a module of its own ...
    [routine] = [name for name in runs[0] if name.startswith("cuvil.panel_gemm")]
    assert len(runs[0]) == 3
    # ... which the second model, all of whose kernels are new, takes from the cache
    assert len(runs[1]) == 2 and routine not in runs[1]


def test_cache_key_depends_on_target_and_kernels():
    text = print_kernel(parse_kernels(ADD_RELU)[0], canonical=True)
    other = print_kernel(parse_kernels(ADD_RELU.replace("512", "256"))[0], canonical=True)
    host = Target.host()
    assert cache_key([text], host, 3) == cache_key([text], host, 3)
    assert cache_key([text], host, 3) != cache_key([text], Target.cross("aarch64"), 3)
    assert cache_key([text], host, 3) != cache_key([text], Target(host.triple, "generic", ""), 3)
    assert cache_key([text], host, 3) != cache_key([other], host, 3)
    assert cache_key([text], host, 3) != cache_key([text], host, 2)


def test_identical_kernels_compile_once():
    layers = [Graph(f"layer{i}", lambda b, x, w, bb: b("cuvil.gelu", b("cuvil.layer_norm", x, w, bb,
                                                                         normalized_ndim=1)),
                    [T("s0", 64), T(64), T(64)]) for i in range(12)]
    kernels = [k for g in layers for k in g.kernels]
    assert len(kernels) == 12       # layer_norm with its gelu epilogue: one kernel per layer
    compiled = compile_kernels(kernels, cache=None)
    assert compiled.unique_functions == 1
    entry_points = [e for text in compiled.llvm_ir_texts for e in re.findall(r"^define void @(\S+)\(ptr", text, re.M)]
    assert len(entry_points) == 1
    assert len(set(compiled.addresses.values())) == 1
    x, w, b = torch.randn(5, 64), torch.randn(64), torch.randn(64)
    torch.testing.assert_close(run(layers[7], compiled, x, w, b),
                               torch.nn.functional.gelu(torch.nn.functional.layer_norm(x, (64,), w, b)),
                               rtol=1e-5, atol=1e-5)


def test_elementwise_inner_loop_uses_ymm_registers():
    host = Target.host()
    if not host.has_feature("avx2"):
        pytest.skip(f"host CPU {host.cpu} has no AVX2")
    compiled = compile_kernels(parse_kernels(ADD_RELU), cache=None)
    asm = compiled.asm("add_relu")
    assert asm.startswith(compiled.symbols["add_relu"] + ":")
    assert re.search(r"vaddps\s+[^\n]*%[yz]mm", asm), asm
    assert re.search(r"vmaxps\s+[^\n]*%[yz]mm", asm), asm
    ir = compiled.llvm_ir("add_relu")
    assert re.search(r"fadd <\d+ x float>", ir)              # the vectoriser's work, before instruction selection


def test_avx512_hosts_get_512_bit_vectors():
    host = Target.host()
    if not host.has_feature("avx512f"):
        pytest.skip(f"host CPU {host.cpu} has no AVX-512")
    asm = compile_kernels(parse_kernels(ADD_RELU), cache=None).asm("add_relu")
    assert re.search(r"vaddps\s+[^\n]*%zmm", asm), asm


def test_x86_codegen_options_reach_the_shown_code_and_stay_inside_cuvil():
    import llvmlite.binding as llvm
    host = Target.host()
    if host.arch != "x86_64":
        pytest.skip("the code generation options are x86-64's")
    compiled = compile_kernels(parse_kernels(ADD_RELU + TOTAL), cache=None)
    [(ir_text, obj)] = [(text, obj) for text, obj in zip(compiled.llvm_ir_texts, compiled.objects)
                        if compiled.symbols["add_relu"] in text]       # one module per kernel

    def plain_asm():
        return host.target_machine().emit_assembly(llvm.parse_assembly(ir_text))
    before = plain_asm()
    shown = jit_module.emit(host, llvm.parse_assembly(ir_text), assembly=True)
    assert shown != before                      # Cuvil's options change these loops' code ...
    assert plain_asm() == before                # ... and are set back for other LLVM users afterwards
    # the object that runs is the one the shown assembly describes: same module, same options
    assert jit_module.emit(host, llvm.parse_assembly(ir_text)) == obj
    shown_lines = iter(shown.splitlines())             # the kernel's view: the same lines, in order
    assert all(line in shown_lines for line in compiled.asm("add_relu").splitlines())


@pytest.mark.parametrize("arch, vector_insn", [("aarch64", r"fmax\s+v\d+\.4s"), ("riscv64", r"vf(max|add)\.v")])
def test_cross_targets_emit_objects_and_vector_assembly(arch, vector_insn):
    target = Target.cross(arch)
    compiled = compile_kernels(parse_kernels(ADD_RELU + TOTAL), target=target, cache=None)
    assert compiled.addresses == {} and "load" not in compiled.timings      # nothing runs here
    assert len(compiled.objects) == 2                                         # one per kernel
    for obj in compiled.objects:
        assert obj[:4] == b"\x7fELF"
        machine = int.from_bytes(obj[18:20], "little")
        assert machine == {"aarch64": 183, "riscv64": 243}[arch]             # ELF e_machine
    assert re.search(vector_insn, compiled.asm("add_relu")), compiled.asm("add_relu")


def test_call_checks_arguments_against_the_kernel():
    compiled = compile_kernels(parse_kernels(ADD_RELU + TOTAL), cache=None)
    a, b, out = torch.randn(3, 512), torch.randn(512), torch.empty(3, 512)
    with pytest.raises(CuvilError, match="expected shape"):
        call_kernel(compiled, "add_relu", [a, torch.randn(256), out])
    with pytest.raises(CuvilError, match="expected torch.float32"):
        call_kernel(compiled, "add_relu", [a, b, out.double()])
    with pytest.raises(CuvilError, match="expected strides"):
        call_kernel(compiled, "add_relu", [torch.randn(512, 3).t(), b, out])
    x, total = torch.randn(1000), torch.empty(1)
    call_kernel(compiled, "total", [x, total])           # not splittable: dims = [s0]
    assert compiled.kernels["total"].dim_exprs == [compiled.kernels["total"].buffers[0].shape[0]]
    torch.testing.assert_close(total[0], (x.double() ** 2).sum().float(), rtol=1e-5, atol=0)


def test_kernels_run_on_the_native_engine():
    runtime = pytest.importorskip("cuvil.runtime", reason="the native runtime (cuvil._native) is not built")
    from cuvil.ir import DType, TensorType, sym
    s0 = sym("s0")
    kernels = parse_kernels(ADD_RELU + TOTAL)
    compiled = compile_kernels(kernels, cache=None)
    module = runtime.load_module(compiled, compiled.runtime_kernels())
    add_relu, total = kernels
    t_in, t_b = TensorType(DType.f32, (s0, 512)), TensorType(DType.f32, (512,))
    prog = runtime.Program(
        inputs=[t_in, t_b], outputs=[t_in, TensorType(DType.f32, (1,))], symbols={"s0": (1, 1 << 20)},
        slots=[runtime.Slot.input(0, t_in), runtime.Slot.input(1, t_b), runtime.Slot.output(0, t_in),
               runtime.Slot.output(1, TensorType(DType.f32, (1,))), runtime.Slot.arena(0, s0 * 512 * 4)],
        arena_bytes=s0 * 512 * 4,
        steps=[runtime.Step("add_relu", [0, 1, 4], add_relu.dim_exprs,
                            split=runtime.Split(len(add_relu.dim_exprs) - 1, 512)),
               runtime.Step("add_relu", [4, 1, 2], add_relu.dim_exprs, deps=[0],
                            split=runtime.Split(len(add_relu.dim_exprs) - 1, 512)),
               runtime.Step("total", [2, 3], [s0 * 512], deps=[1])])
    exe = runtime.Executable(prog, module, min_chunk_ns=1)      # split every splittable step
    a, b = torch.randn(37, 512), torch.randn(512)
    out, tot = exe(a, b)
    ref = torch.relu(torch.relu(a + b) + b)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(tot[0], (ref.double() ** 2).sum().float(), rtol=1e-5, atol=0)


def test_compile_function_times_every_phase(tmp_path):
    g = Graph("mlp", lambda b, x, w, bb: b("cuvil.relu", b("cuvil.linear", x, w, bb)), [T("s0", 8), T(4, 8), T(4)])
    lowered, compiled = compile_function(g.fn, cache=ObjectCache(tmp_path))
    assert [lk.kernel.name for lk in lowered] == list(compiled.kernels)
    assert set(compiled.timings) == {"lowering", "cache_lookup", "llvm_ir", "optimize", "codegen", "load"}
    assert all(t >= 0 for t in compiled.timings.values())
    name = lowered[0].kernel.name
    assert compiled.kernel_ir(name).startswith(f"kernel @{name}(")
    assert "scipy_cblas_sgemm" in compiled.llvm_ir(name)
    assert re.search(r"call\w*\s+scipy_cblas_sgemm", compiled.asm(name))
