"""Saved models: `compiled.save(path)` writes what running needs, `cuvil.load(path)` runs it.

    fast = cuvil.compile(model); fast(x)     # torch.export, the passes, LLVM
    fast.save("model.cuvil")
    model = cuvil.load("model.cuvil")        # no export, no passes, no LLVM: links the saved code
    y = model(x)

The file is torch.save's zip format, read with `torch.load(mmap=True, weights_only=True)`: the
weights are mapped rather than read, and nothing in the file is unpickled as code. Two entries: a
JSON manifest and one byte tensor, the blob, holding every constant and object (views of it at
load). The manifest holds, per compiled variant of the model:
- the engine's program as plain data (`Program.describe`): slots, steps, dependencies, splits and
  the arena size, every size a postfix expression over the dynamic dims;
- the object code of its kernels, the symbol each kernel is exported as, and the library symbols
  the code calls (libc, BLAS), linked again at load;
- the constant tensors as the passes left them (BatchNorm folded, weights packed in panels);
- the guard (input structure, dtypes, static dims, ranges of the dynamic ones) and the output
  structure.

The machine code is what was compiled for the target: loading checks the architecture and that
this CPU has every feature the code was compiled with. A model compiled for a cross target
(`target="aarch64"`) saves the same way and loads on a machine of that architecture.
"""
from __future__ import annotations

import inspect
import itertools
import json
import math
import os
import zlib

import torch
import torch.utils._pytree as pytree

from . import __version__, _native
from .codegen.jit import library_symbols, link_objects
from .codegen.target import Target
from .compiled import MISS, Guard, NativeCall, canonical_call, check_threads, fast_path, fast_paths
from .compiler import shared_entries
from .errors import CuvilError
from .frontend import hf_caches
from .runtime import Kernel, StepTiming, load_module, set_num_threads

FORMAT = "cuvil-saved-model"
FORMAT_VERSION = 5    # 2: a variant's code may be several objects; 3: constants and objects in one blob;
READS = (2, 3, 4, 5)  # 4: status slots (kernels' index checks), which a reader of 3 would not know;
                      # 5: random draws (a guard's "draws"), which a reader of 4 would not make
BLOB_ALIGN = 64       # each constant starts on a cache line of the blob


# ----------------------------------------------------------------------------- saving

def save(path: str | os.PathLike, variants, signature: inspect.Signature | None, extra: dict | None = None) -> None:
    """Write `variants` (a CompiledModel's compiled variants) to `path`, with `extra` (JSON-able
    data for the writer: the compiled-model cache's weights digest) in the manifest."""
    constants: list[torch.Tensor] = []
    objects: list[torch.Tensor] = []
    states = [_loaded_state(v, constants, objects) if isinstance(v, _SavedVariant) else
              _variant_state(v, constants, objects) for v in variants]
    manifest = {"format": FORMAT, "version": FORMAT_VERSION, "cuvil": __version__,
                "signature": None if signature is None else
                [[p.name, int(p.kind), p.default is not inspect.Parameter.empty]
                 for p in signature.parameters.values()],
                "variants": states, "extra": extra or {}}
    # a new file replaces the old one: a model loaded from the old file maps its weights, and
    # rewriting that file in place would pull the pages from under it (SIGBUS on its next call)
    path = os.fspath(path)
    partial = f"{path}.{os.getpid()}.partial"
    try:
        blob, manifest["constants"], manifest["objects"] = _blob(constants, objects)
        manifest["blob_crc32"] = _crc32(blob)
        torch.save({"manifest": json.dumps(manifest), "blob": blob}, partial)
        os.replace(partial, path)
    except (OSError, RuntimeError) as e:      # torch.save reports a file it cannot open as a RuntimeError
        raise CuvilError(f"cannot write the saved model {path}: {e}") from None
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def _variant_state(v, constants: list[torch.Tensor], objects: list[torch.Tensor]) -> dict:
    native = v.native
    kernels, program = native.kernels, native.program
    entry = shared_entries(kernels)           # kernel name -> the name its shared code is registered as
    registered = {name: name for name in entry.values()}
    description = program.describe(registered)
    for slot in description["slots"]:
        if slot["kind"] == "const":
            slot["data"] = _constant_index(slot["data"], constants)
    first = len(objects)
    objects += [torch.frombuffer(bytearray(obj), dtype=torch.uint8) for obj in kernels.objects]
    target = kernels.target
    return {
        "guard": v.guard.state(),
        **_dump_out_spec(v.imported.output_structure),
        "outputs": [[shape, str(dtype).removeprefix("torch.")] for shape, dtype in v.outputs],
        "symbolic": bool(program.symbols),
        "program": description,
        "kernels": [[name, kernels.symbols[name], len(kernels.kernels[name].buffers),
                     len(kernels.kernels[name].dim_exprs), kernels.kernels[name].parallel_loop is not None]
                    for name in registered],
        "objects": list(range(first, len(objects))),
        "step_names": [lk.kernel.name for lk in native.lowered],
        "imports": library_symbols(kernels.llvm_ir_texts),
        "target": {"triple": target.triple, "cpu": target.cpu, "features": target.features,
                   "abiname": target.abiname},
    }


def _loaded_state(v: "_SavedVariant", constants: list[torch.Tensor], objects: list[torch.Tensor]) -> dict:
    """The state of a variant loaded from a file, its constants and objects renumbered for the new one."""
    state, data = v.source
    state = json.loads(json.dumps(state))
    for slot in state["program"]["slots"]:
        if slot["kind"] == "const":
            slot["data"] = _constant_index(data["constants"][slot["data"]], constants)
    first = len(objects)
    objects += [data["objects"][i] for i in state["objects"]]
    state["objects"] = list(range(first, len(objects)))
    return state


def _blob(constants: list[torch.Tensor], objects: list[torch.Tensor]) -> tuple[torch.Tensor, list, list]:
    """Every constant and object in one byte tensor (one storage to map: loading BERT-small's 80
    tensors apiece took more than half of its load), and where each is: [offset, dtype, shape] per
    constant, [offset, bytes] per object."""
    parts: list[torch.Tensor] = []
    end = [0]

    def place(t: torch.Tensor) -> int:
        offset, data = end[0], t.detach().contiguous().reshape(-1).view(torch.uint8)
        parts.extend([data, torch.zeros(-data.numel() % BLOB_ALIGN, dtype=torch.uint8)])
        end[0] += data.numel() + parts[-1].numel()
        return offset
    constant_at = [[place(t), str(t.dtype).removeprefix("torch."), list(t.shape)] for t in constants]
    object_at = [[place(t), t.numel()] for t in objects]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.uint8), constant_at, object_at


def _unblob(manifest: dict, data: dict) -> dict:
    """The constants and objects of a loaded file, as views of its blob (version 3) or as saved."""
    if manifest["version"] == 2:
        return data
    blob = data["blob"]
    if "blob_crc32" in manifest and _crc32(blob) != manifest["blob_crc32"]:    # (files before it have none)
        raise ValueError("its weights and code do not match their checksum")
    constants = []
    for offset, dtype, shape in manifest["constants"]:
        dtype = getattr(torch, dtype)
        n = dtype.itemsize * math.prod(shape)
        constants.append(blob[offset:offset + n].view(dtype).reshape(shape))
    return {"constants": constants, "objects": [blob[o:o + n] for o, n in manifest["objects"]]}


def _crc32(blob: torch.Tensor) -> int:
    """A damaged file's weights would give wrong answers and its code could crash the process: the
    blob's CRC-32 is checked at every load (0.5 ms a MB here, read through the file's mapping)."""
    return zlib.crc32(memoryview(blob.numpy())) if blob.numel() else 0


def _constant_index(t: torch.Tensor, constants: list[torch.Tensor]) -> int:
    for i, c in enumerate(constants):        # a weight two steps read is saved once
        if c is t:
            return i
    whole = t.is_contiguous() and t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.nbytes
    constants.append(t if whole else t.contiguous().clone())    # torch.save writes whole storages
    return len(constants) - 1


# ----------------------------------------------------------------------------- loading

class SavedModel:
    """A model loaded with `cuvil.load`: call it like the original. A call that no saved variant
    accepts raises, saying why (a saved model cannot recompile: it has no model to compile)."""

    def __init__(self, path: str, variants: list["_SavedVariant"], signature: inspect.Signature | None,
                 extra: dict | None = None):
        self.path, self.variants, self._signature = path, variants, signature
        self.extra = extra or {}
        self._fast = fast_paths(variants)

    def __call__(self, *args, **kwargs):
        if not kwargs:
            for fast in self._fast:
                if (out := fast(args)) is not MISS:
                    return out
        variant, (tensors, symbols) = self._match(args, kwargs)
        return hf_caches.write_back(args, kwargs, variant.call(tensors, symbols))

    def profile(self, *args, **kwargs):
        """Run once, recording every kernel call: (outputs, [StepTiming]), as `CompiledModel.profile`."""
        variant, (tensors, symbols) = self._match(args, kwargs)
        return variant.profile(tensors, symbols)

    def _match(self, args: tuple, kwargs: dict):
        """The variant that accepts the call, and its (input tensors, symbol values)."""
        if kwargs and self._signature is not None:
            args, kwargs = canonical_call(self._signature, args, kwargs, "the saved model's signature")
        for v in self.variants:
            hit = v.guard.match(args, kwargs)
            if hit is not None:
                v.guard.check_indices(*hit)
                return v, hit
        reasons = "; ".join(m.text for v in self.variants for m in v.guard.mismatches(args, kwargs))
        raise CuvilError(f"{self.path}: no saved variant accepts this call: {reasons}")

    def __repr__(self) -> str:
        return f"SavedModel({self.path!r}, {len(self.variants)} variant(s))"


class _SavedVariant:
    def __init__(self, guard: Guard, call: NativeCall, step_names: list[str], tracker, source: tuple[dict, dict]):
        self.guard, self.call, self.step_names = guard, call, step_names
        self.source = source          # (its state in the file, the file's tensors): saving it again
        self.fast = fast_path(guard, call)
        self._tracker = tracker       # keeps the linked code alive (the JIT module holds it too)

    def profile(self, tensors, symbols: list[int]):
        outputs, records = self.call.run(tensors, symbols, True)
        return outputs, [StepTiming(s, self.step_names[s], c, t, b, e) for s, c, t, b, e in records]


def load(path: str | os.PathLike, threads: int | None = None) -> SavedModel:
    """Load a model saved with `CompiledModel.save`; `threads` sets the engine's pool like
    `cuvil.compile(threads=...)`."""
    path = os.fspath(path)
    try:
        data = torch.load(path, mmap=True, weights_only=True)
        manifest = json.loads(data["manifest"])
    except FileNotFoundError:
        raise CuvilError(f"{path}: no such file") from None
    except Exception as e:
        raise CuvilError(f"{path}: not a saved Cuvil model ({_first_line(e)})") from None
    if manifest.get("format") != FORMAT:
        raise CuvilError(f"{path}: not a saved Cuvil model")
    if manifest.get("version") not in READS:
        raise CuvilError(f"{path}: saved in format version {manifest.get('version')} (by Cuvil "
                         f"{manifest.get('cuvil')}); this Cuvil ({__version__}) reads versions "
                         f"{', '.join(map(str, READS))}")
    if threads is not None:
        check_threads(threads, "cuvil.load: threads")
        set_num_threads(threads)
    try:
        data = _unblob(manifest, data)
        variants = [_load_variant(path, state, data) for state in manifest["variants"]]
        signature = _signature(manifest["signature"])
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as e:     # a manifest that lies
        raise CuvilError(f"{path}: the saved model is damaged ({_first_line(e)})") from None
    return SavedModel(path, variants, signature, manifest.get("extra"))


def _first_line(e: Exception) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__


def _load_variant(path: str, state: dict, data: dict) -> _SavedVariant:
    _check_target(path, Target(**state["target"]))
    objects = [data["objects"][i].numpy().tobytes() for i in state["objects"]]
    tracker, addresses = link_objects(objects, [sym for _, sym, *_ in state["kernels"]], state["imports"])
    module = load_module(tracker, [Kernel(name, addresses[sym], n_slots, n_dims, splittable)
                                   for name, sym, n_slots, n_dims, splittable in state["kernels"]])
    address_of = {name: addresses[sym] for name, sym, *_ in state["kernels"]}
    description = dict(state["program"])
    description["steps"] = [{**step, "kernel": address_of[step["kernel"]]} for step in description["steps"]]
    description["slots"] = [{**slot, "data": data["constants"][slot["data"]]} if slot["kind"] == "const" else slot
                            for slot in description["slots"]]
    try:
        engine = _native.Engine(module, description)
    except _native.ProgramError as e:
        raise CuvilError(f"{path}: the saved program is invalid: {e}") from None
    if hf_caches.CACHE_MODULE in state["out_spec"] + state["guard"]["in_spec"]:     # a decoder's key/value cache
        hf_caches.register_all_caches()
    try:
        out_spec = _load_out_spec(state)
    except Exception as e:
        raise CuvilError(f"{path}: cannot rebuild the model's output structure ({e}); import the module that "
                         f"defines the output type before loading") from None
    outputs = [(shape, getattr(torch, dtype)) for shape, dtype in state["outputs"]]
    guard = Guard.from_state(state["guard"])
    return _SavedVariant(guard, NativeCall(engine, outputs, out_spec, state["symbolic"], guard.draws),
                         state["step_names"], tracker, (state, data))


def _dump_out_spec(spec: pytree.TreeSpec) -> dict:
    """The output structure as pytree's JSON, with the torch.return_types nodes (topk, sort, max
    along a dim: pytree cannot write them) as tuples, and their names by pre-order position."""
    names = {}

    def plain(node: pytree.TreeSpec, at: int, children: list) -> pytree.TreeSpec:
        if pytree.is_structseq_class(node.type):
            names[str(at)] = node.type.__name__
            return pytree.TreeSpec(tuple, None, children)
        return pytree.TreeSpec(node.type, node.context, children)
    return {"out_spec": pytree.treespec_dumps(_rebuild(spec, plain)), "structseqs": names}


def _load_out_spec(state: dict) -> pytree.TreeSpec:
    names = state.get("structseqs", {})

    def restore(node: pytree.TreeSpec, at: int, children: list) -> pytree.TreeSpec:
        typ = getattr(torch.return_types, names[str(at)]) if str(at) in names else node.type
        return pytree.TreeSpec(typ, None if str(at) in names else node.context, children)
    return _rebuild(pytree.treespec_loads(state["out_spec"]), restore)


def _rebuild(spec: pytree.TreeSpec, node_for) -> pytree.TreeSpec:
    """`spec` rebuilt bottom-up: `node_for(node, position, new children)` makes each inner node;
    positions count every node, leaves too, in pre-order."""
    count = itertools.count()

    def walk(node: pytree.TreeSpec) -> pytree.TreeSpec:
        at = next(count)
        if node.is_leaf():
            return node
        return node_for(node, at, [walk(c) for c in node.children()])
    return walk(spec)


def _check_target(path: str, saved: Target) -> None:
    host = Target.host()
    if saved.arch != host.arch:
        raise CuvilError(f"{path}: compiled for {saved.triple} ({saved.cpu}); this machine is {host.triple}")
    have = set(host.features.split(","))
    missing = [f[1:] for f in saved.features.split(",") if f.startswith("+") and f not in have]
    if missing:
        raise CuvilError(f"{path}: compiled for a {saved.cpu} CPU with {', '.join(missing)}, which this CPU "
                         f"({host.cpu}) lacks; compile the model again on this machine")


def _signature(params: list | None) -> inspect.Signature | None:
    if params is None:
        return None
    return inspect.Signature([inspect.Parameter(name, inspect._ParameterKind(kind),
                                                default=None if has_default else inspect.Parameter.empty)
                              for name, kind, has_default in params])
