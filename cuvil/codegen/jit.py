"""Compile kernels: an LLVM module per distinct kernel, O3 for the target, object cache, ORC JIT.

`compile_kernels(kernels)` returns a `CompiledKernels` holding each kernel's address (kernels
with the same structure share one function: the symbol is a hash of `kernel_identity`),
the time of each phase, and, on request, the kernel IR, optimised LLVM IR and assembly per kernel,
and where in them each graph op's code is (`op_lines`, read from the debug locations).
The objects are loaded into the process-wide ORC LLJIT as one library, linked only against the
BLAS GEMM and libc's memset/memcpy/memmove (which LLVM may emit for fill and copy loops); the code
stays loaded as long as the `CompiledKernels` object lives.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import itertools
import re
import threading
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field

import llvmlite.binding as llvm

from .. import _native
from ..errors import CuvilError
from .cache import CacheEntry, ObjectCache, cache_key, unit_key
from .kernel_ir import Kernel, verify_kernel
from .kernel_text import LineMap, print_kernel
from . import llvm_compile
from .compile_tasks import CompileTasks
from .llvm_emit import GEMM_SYMBOL, ModuleBuilder, SharedHelpers, helper_names
from .target import Target

_llvm_lock = threading.RLock()     # LLVM's global state (targets, the LLJIT) is not thread-safe
_jit = None
_library_ids = itertools.count()
LIBC_SYMBOLS = ("memset", "memcpy", "memmove")


def kernel_symbol(identity: str) -> str:
    return "cuvil_k_" + hashlib.sha256(identity.encode()).hexdigest()[:16]


def kernel_identity(kernel: Kernel, lines: LineMap | None = None) -> str:
    """What makes two kernels share one compiled function: the canonical text, and which of its
    nodes come from the same op (the debug locations depend on it; op ids do not enter). `lines`
    receives where the statements print."""
    lines = lines if lines is not None else LineMap()
    return print_kernel(kernel, canonical=True, lines=lines) + f"// ops {lines.layout()}\n"


@dataclass
class CompiledKernels:
    """The compiled kernels of one model."""
    kernels: dict[str, Kernel]
    symbols: dict[str, str]                 # kernel name -> LLVM symbol (shared by identical kernels)
    target: Target
    key: str
    cache_hit: bool
    timings: dict[str, float]               # phase -> seconds
    llvm_ir_texts: list[str]                # the optimised modules, one per object
    addresses: dict[str, int] = field(default_factory=dict)   # kernel name -> address (host only)
    objects: list[bytes] = field(default_factory=list)        # compiled in parallel, linked as one library
    lines: dict[str, LineMap] = field(default_factory=dict)     # kernel name -> where its statements print
    units: list[str] = field(default_factory=list)             # each object's module key in `cache`
    cache: ObjectCache | None = None                            # keeps the assembly it shows, per module
    _tracker: object = None
    _ir_functions: dict[str, "CodeLines"] | None = None
    _asm_functions: dict[str, "CodeLines"] | None = None

    def address(self, kernel_name: str) -> int:
        try:
            return self.addresses[kernel_name]
        except KeyError:
            raise CuvilError(f"no compiled kernel named '{kernel_name}'") from None

    @property
    def unique_functions(self) -> int:
        return len(set(self.symbols.values()))

    def runtime_kernels(self) -> list:
        """The kernels as `cuvil.runtime.Kernel` records (address, slots, dims, splittable) for
        `cuvil.runtime.load_module(self, ...)`; this object keeps their code alive."""
        from ..runtime import Kernel as RuntimeKernel
        return [RuntimeKernel(name, self.addresses[name], len(k.buffers), len(k.dim_exprs),
                              k.parallel_loop is not None) for name, k in self.kernels.items()]

    def kernel_ir(self, name: str) -> str:
        return print_kernel(self.kernels[name])

    def llvm_ir(self, name: str) -> str:
        """The optimised LLVM IR of the kernel's entry function (the body is inlined into it),
        without its debug attachments."""
        return self._llvm_lines(name).text

    def asm(self, name: str) -> str:
        """The kernel's assembly, without its debug directives."""
        return self._asm_lines(name).text

    def op_lines(self, name: str) -> list[dict]:
        """Where the code of each graph op of the kernel is: `{"op": id, "kernel_ir": [[first, last],
        ...], "llvm_ir": [...], "asm": [...]}` (1-based inclusive line ranges of `kernel_ir(name)`,
        `llvm_ir(name)` and `asm(name)`), in the order the ops first appear in the kernel IR."""
        kernel_ir: dict[int, list[int]] = {}
        for line, ops in self.lines[name].ops_by_line().items():
            for op in ops:
                kernel_ir.setdefault(op, []).append(line)
        llvm_ir, asm = self._llvm_lines(name).lines_of_slot, self._asm_lines(name).lines_of_slot
        return [{"op": op, "kernel_ir": _ranges(kernel_ir.get(op, ())), "llvm_ir": _ranges(llvm_ir.get(slot, ())),
                 "asm": _ranges(asm.get(slot, ()))} for op, slot in self.lines[name].slots().items()]

    def _llvm_lines(self, name: str) -> "CodeLines":
        if self._ir_functions is None:
            self._ir_functions = {}
            for text in self.llvm_ir_texts:     # debug metadata is numbered per module
                locations = {int(m[1]): (int(m[2]), int(m[3] or 0)) for m in DI_LOCATION.finditer(text)}
                self._ir_functions.update({sym: CodeLines.of_llvm(function, locations)
                                           for sym, function in _split(LLVM_FUNCTION, text).items()})
        return _function(self._ir_functions, self.symbols[name], "modules")

    def _asm_lines(self, name: str) -> "CodeLines":
        if self._asm_functions is None:
            self._asm_functions = {}
            for i, text in enumerate(self.llvm_ir_texts):
                asm = self._assembly(text, self.units[i] if self.cache is not None else None)
                self._asm_functions.update({sym: CodeLines.of_asm(f) for sym, f in _split(ASM_FUNCTION, asm).items()})
        return _function(self._asm_functions, self.symbols[name], "assembly")

    def _assembly(self, llvm_ir: str, unit: str | None) -> str:
        """The assembly of an optimised module: LLVM's code generation again, so it is kept in the
        object cache with the module's object."""
        asm = self.cache.load_assembly(unit) if unit is not None else None
        if asm is None:
            with _llvm_lock:
                asm = emit(self.target, llvm.parse_assembly(llvm_ir), assembly=True)
            if unit is not None:
                try:
                    self.cache.store_assembly(unit, asm)
                except OSError:
                    pass        # only the next report is slower
        return asm


# one function of the optimised module / of its assembly, by symbol (split once, looked up per kernel)
LLVM_FUNCTION = re.compile(r'^define [^\n]*@"?([\w.$]+)"?\(.*?^}$', re.M | re.S)
ASM_FUNCTION = re.compile(r'^"?([A-Za-z_][\w.$]*)"?:.*?^\.Lfunc_end\d+:', re.M | re.S)   # not .L labels
DI_LOCATION = re.compile(r"^!(\d+) = (?:distinct )?!DILocation\(line: (\d+)(?:, column: (\d+))?", re.M)
DBG_ATTACHMENT = re.compile(r",? !dbg !(\d+)")
ASM_LOC = re.compile(r"^\s*\.loc\s+\d+\s+(\d+)\s+(\d+)")
# what only debug info brings into a function's assembly: line directives, call frame information
# for .debug_frame, and the labels DWARF refers to
ASM_DEBUG_ONLY = re.compile(r"^\s*\.(?:loc|file|cfi_\w+)\b|^\.L(?:tmp|func_begin)\d+:$")


@dataclass
class CodeLines:
    """A function's code without its debug noise, and the debug location ((kernel IR line, op
    slot), or None) of each of its lines."""
    text: str
    locations: list

    @staticmethod
    def of_llvm(function: str, di_locations: dict[int, tuple[int, int]]) -> "CodeLines":
        lines, locations = [], []
        for line in function.splitlines():
            m = DBG_ATTACHMENT.search(line)
            locations.append(di_locations.get(int(m[1])) if m else None)   # the define's !dbg is its scope
            lines.append(DBG_ATTACHMENT.sub("", line))
        return CodeLines("\n".join(lines) + "\n", locations)

    @staticmethod
    def of_asm(function: str) -> "CodeLines":
        lines, locations, here = [], [], None
        for line in function.splitlines():
            m = ASM_LOC.match(line)
            if m:
                here = (int(m[1]), int(m[2]))
            elif not ASM_DEBUG_ONLY.match(line):
                lines.append(line)
                instruction = line[:1].isspace() and not line.lstrip().startswith((".", "#"))
                locations.append(here if instruction else None)
        return CodeLines("\n".join(lines) + "\n", locations)

    @functools.cached_property
    def lines_of_slot(self) -> dict[int, list[int]]:
        """op slot -> the lines (1-based) of its code. Kernels of one structure share the function
        and these lines; only which op fills each slot differs."""
        out: dict[int, list[int]] = {}
        for n, loc in enumerate(self.locations, 1):
            if loc:
                out.setdefault(loc[1], []).append(n)
        return out


def _ranges(lines) -> list[list[int]]:
    """Sorted line numbers as [first, last] runs."""
    out: list[list[int]] = []
    for n in sorted(lines):
        if out and out[-1][1] == n - 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    return out


def _split(pattern: re.Pattern, text: str) -> dict[str, str]:
    return {m.group(1): m.group(0) + "\n" for m in pattern.finditer(text)}


def _function(functions: dict, symbol: str, where: str):
    try:
        return functions[symbol]
    except KeyError:
        raise CuvilError(f"function {symbol} is not in the {where}") from None


def build_module(kernels, symbols: dict[str, str], target: Target, lines: dict[str, LineMap] | None = None,
                 debug: bool = True) -> llvm.ModuleRef:
    """Kernel IR -> one verified LLVM module (each distinct structure emitted once), with debug
    locations unless `debug=False`; `lines`: each kernel's LineMap (printed here if not given)."""
    mb = ModuleBuilder(debug=debug, target=target)
    done = set()
    for k in kernels:
        sym = symbols[k.name]
        if sym not in done:
            mb.add_kernel(k, sym, (lines or {}).get(k.name))
            done.add(sym)
    mod = llvm.parse_assembly(str(mb.module))
    mod.verify()
    return mod


def optimize(mod: llvm.ModuleRef, tm: llvm.TargetMachine, opt_level: int = 3) -> None:
    llvm_compile.optimize(mod, tm, opt_level)


def emit(target: Target, mod: llvm.ModuleRef, assembly: bool = False, tm: llvm.TargetMachine | None = None):
    """Code generation: `mod` (optimised) as object code, or as assembly text."""
    return llvm_compile.emit(mod, tm or target.target_machine(), target.arch, assembly)


def _lljit():
    global _jit
    if _jit is None:
        _jit = llvm.create_lljit_compiler(Target.host().target_machine(jit=True))
    return _jit


def library_symbols(ir_texts: list[str]) -> list[str]:
    """The outside symbols the kernels of (optimised) LLVM modules call: libc's, BLAS's GEMM and
    the native runtime's routines, those that are used."""
    used = [name for name in (GEMM_SYMBOL, *_native.routines()) if any(f"@{name}(" in t for t in ir_texts)]
    return [*LIBC_SYMBOLS, *used]


def _symbol_address(name: str) -> int:
    if name == GEMM_SYMBOL:
        from ..runtime import blas
        return blas.address(GEMM_SYMBOL)
    routines = _native.routines()
    if name in routines:
        return routines[name]
    if name not in LIBC_SYMBOLS:
        raise CuvilError(f"the kernels import '{name}', which Cuvil does not provide")
    return ctypes.cast(getattr(ctypes.CDLL(None), name), ctypes.c_void_p).value


def link_objects(objects: list[bytes], exports, imports) -> tuple[object, dict[str, int]]:
    """Link host objects into the process's JIT as one library: (the tracker that keeps its code
    alive, {exported symbol: address}). `imports` names the library symbols they call."""
    exports = sorted(set(exports))
    with _llvm_lock:
        builder = llvm.JITLibraryBuilder()
        for obj in objects:
            builder.add_object_img(obj)
        for name in imports:
            builder.import_symbol(name, _symbol_address(name))
        for sym in exports:
            builder.export_symbol(sym)
        try:
            tracker = builder.link(_lljit(), f"cuvil_lib_{next(_library_ids)}")
        except RuntimeError as e:
            raise CuvilError(f"the JIT could not link the compiled kernels: {e}") from None
        return tracker, {sym: tracker[sym] for sym in exports}


DISK_CACHE = "disk"


def compile_kernels(kernels, target: Target | None = None, cache: ObjectCache | str | None = DISK_CACHE,
                    opt_level: int = 3, timings: dict[str, float] | None = None) -> CompiledKernels:
    """Compile kernels into objects (one per LLVM module: `build_units`) and, for the host target,
    load them.

    `cache`: the on-disk cache in `$CUVIL_CACHE_DIR` by default, an `ObjectCache`, or None for
    none. `timings` may already hold earlier phases (e.g. lowering); this call's are added."""
    if cache == DISK_CACHE:
        cache = ObjectCache()
    kernels = list(kernels)
    names = [k.name for k in kernels]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise CuvilError(f"two kernels are named '{dup}'")
    for k in kernels:
        verify_kernel(k)
    target = target or Target.host()
    timings = dict(timings or {})
    lines = {k.name: LineMap() for k in kernels}
    identity = {k.name: kernel_identity(k, lines[k.name]) for k in kernels}
    symbols = {name: kernel_symbol(text) for name, text in identity.items()}
    key = cache_key(set(identity.values()), target, opt_level)

    t = time.perf_counter()
    entry = cache.load(key) if cache is not None else None
    hit = entry is not None
    timings["cache_lookup"] = time.perf_counter() - t
    if not hit:
        entry = _compile_objects(kernels, symbols, lines, target, opt_level, timings, cache)
        if cache is not None:
            try:
                cache.store(key, entry)
            except OSError as e:
                warnings.warn(f"cuvil: could not write the object cache at {cache.root}: {e}")
    result = CompiledKernels({k.name: k for k in kernels}, symbols, target, key, hit, timings, entry.llvm_ir,
                             objects=entry.objects, lines=lines, units=entry.units, cache=cache)
    if target.is_host:
        t = time.perf_counter()
        _load(result)
        timings["load"] = time.perf_counter() - t
    return result


def compile_function(fn, groups=None, target: Target | None = None, cache: ObjectCache | str | None = DISK_CACHE):
    """Lower graph function `fn` (default grouping unless `groups` is given) and compile all its
    kernels into one module; returns (lowered kernels, CompiledKernels) with `lowering` timed too."""
    from .lower import lower_function
    t = time.perf_counter()
    lowered = lower_function(fn, groups)
    timings = {"lowering": time.perf_counter() - t}
    return lowered, compile_kernels([lk.kernel for lk in lowered], target=target, cache=cache, timings=timings)


def build_units(kernels, symbols: dict[str, str], target: Target, lines: dict[str, LineMap]) -> list[str]:
    """Kernel IR -> textual LLVM modules that link into one program (`iter_units`)."""
    return list(iter_units(kernels, symbols, target, lines))


def iter_units(kernels, symbols: dict[str, str], target: Target, lines: dict[str, LineMap]):
    """The textual LLVM modules of `build_units`, each as soon as it is written: one module per
    distinct kernel, then one for the GEMM loop nests several of them call (`SharedHelpers`)."""
    distinct: dict[str, Kernel] = {}        # symbol -> the first kernel of that structure
    for k in kernels:
        distinct.setdefault(symbols[k.name], k)
    users = Counter(name for k in distinct.values() for name in helper_names(k))
    helpers = SharedHelpers(target, {name for name, n in users.items() if n > 1})
    for sym, k in distinct.items():
        mb = ModuleBuilder(sym, target=target, helpers=helpers)
        mb.add_kernel(k, sym, lines.get(k.name))
        helpers.define_own()
        yield str(mb.module)
    shared = helpers.place()
    if shared:
        yield str(shared.module)


def _compile_objects(kernels, symbols, lines, target: Target, opt_level: int, timings: dict,
                     cache: ObjectCache | None) -> CacheEntry:
    """One object per module: from the object cache where it has the module, else compiled by
    LLVM, each module handed to `CompileTasks` as soon as it is written (compile workers take
    them while this process writes the rest)."""
    t = time.perf_counter()
    units, keys, found = [], [], {}
    with CompileTasks(target, opt_level, len(set(symbols.values())), _llvm_lock) as compiles:
        for unit in iter_units(kernels, symbols, target, lines):
            key = unit_key(unit, target, opt_level)
            units.append(unit)
            keys.append(key)
            cached = cache.load_unit(key) if cache is not None else None
            if cached is None:
                compiles.add(unit)
            else:
                found[unit] = cached
        timings["llvm_ir"] = time.perf_counter() - t
        compiled = compiles.finish(timings) if len(found) < len(units) else {}
    if cache is not None:
        cache.units_reused += len(found)
        _store_units(cache, {k: compiled[u] for u, k in zip(units, keys) if u in compiled})
    done = {**found, **compiled}
    return CacheEntry([done[u][0] for u in units], [done[u][1] for u in units], keys)


def _store_units(cache: ObjectCache, units: dict[str, tuple[bytes, str]]) -> None:
    try:
        for key, (obj, ir) in units.items():
            cache.store_unit(key, obj, ir)
    except OSError as e:
        warnings.warn(f"cuvil: could not write the object cache at {cache.root}: {e}")


def _load(result: CompiledKernels) -> None:
    result._tracker, addr = link_objects(result.objects, result.symbols.values(),
                                         library_symbols(result.llvm_ir_texts))
    result.addresses = {name: addr[sym] for name, sym in result.symbols.items()}
