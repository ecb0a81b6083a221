"""The compiled-model cache: a model compiled once is loaded, not compiled, by the next process.

`cuvil.compile(model)` with `cache=True` (the default) looks up the call before torch.export runs:

    key = SHA-256(Cuvil's code and native module, torch, llvmlite and LLVM, the host CPU,
                  the compile options, the call's structure, dtypes and static sizes (dynamic
                  dims by name, with their ranges), and the model's fingerprint)

The model's fingerprint (`cuvil.fingerprint`) digests its code, attributes and weights; the
weights' bytes are checked against the entry rather than named in the key (`ModelKey`), so new
weights for the same model rewrite its entry. A hit loads the entry (a saved model,
`cuvil/saved.py`: program, object code, packed weights, guard) in milliseconds; a miss compiles
and writes one. An entry whose guard does not accept the call, or
that cannot be read, is a miss (and is rewritten). What a hit lacks (the CompileReport, the
torch.export capture) is compiled on demand when asked for.

Entries live in `$CUVIL_CACHE_DIR/models` (default `~/.cache/cuvil/models`), one file per key,
written atomically, in a background thread (BERT-small's 14 MB took 85 ms of its cold compile;
`flush()` waits for the writes, and so does every read of the cache and the process's exit); a
model whose tensors pass `$CUVIL_MODEL_CACHE_MAX_GIB` (2 by default) is not
written, since its entry would copy them. `cache="objects"` keeps only the object cache (torch.export and the passes
always run); `cache=False` neither.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import llvmlite
import llvmlite.binding as llvm
import torch
import torch.utils._pytree as pytree
from torch.nn.modules import module as torch_module

from .codegen.cache import default_cache_dir
from .codegen.target import Target
from .errors import CuvilError
from .fingerprint import Digest, Unfingerprintable, contents_digest, cuvil_digest

FORMAT = "cuvil-model-cache 1"


MAX_ENTRY_ENV = "CUVIL_MODEL_CACHE_MAX_GIB"
DEFAULT_MAX_ENTRY_GIB = 2.0     # an entry is a copy of the (packed) weights: big models are not copied by default


def max_entry_bytes() -> float:
    try:
        return float(os.environ.get(MAX_ENTRY_ENV, DEFAULT_MAX_ENTRY_GIB)) * 2**30
    except ValueError:
        return DEFAULT_MAX_ENTRY_GIB * 2**30


def cache_root() -> Path:
    return default_cache_dir() / "models"


def entry_path(key: str) -> Path:
    return cache_root() / key[:2] / f"{key}.cuvil"


@dataclass
class ModelKey:
    """An entry's key in two parts: `name` (the digest of all but the bytes of the model's tensors)
    names the entry's file; `weights()` (those bytes' digest) must equal the one the entry was
    written with. A model whose weights change so keeps one entry, rewritten, not one per version,
    and a lookup that finds no entry does not hash them. A compile's key extends its call's
    (`model_key(call_key(...), options)`), and the two share the weights' digest."""
    name: str
    tensors: list[torch.Tensor]
    of_call: "ModelKey | None" = None
    _weights: str | None = None

    def weights(self) -> str:
        if self.of_call is not None:
            return self.of_call.weights()
        if self._weights is None:
            self._weights = contents_digest(self.tensors)
        return self._weights


def call_key(target, inputs: dict, hints: dict, ranges: dict) -> ModelKey:
    """The key of a call of `target` with `inputs` (by parameter name) whose dynamic dims are
    `hints` ({name: {axis: dim}}) in `ranges`; their sizes are not part of it. What torch.export
    makes of the call depends on nothing else (`cuvil.imports`). Raises Unfingerprintable when the
    model reaches something the fingerprint cannot digest."""
    d = Digest()
    d.text(FORMAT)
    for part in (f"cuvil {cuvil_digest()}", f"torch {torch.__version__}", f"llvmlite {llvmlite.__version__}",
                 f"llvm {llvm.llvm_version_info}", f"python {sys.version}", Target.host().key(),
                 f"default dtype {torch.get_default_dtype()}"):
        d.text(part)
    d.text(json.dumps({"hints": {k: {str(a): n for a, n in v.items()} for k, v in sorted(hints.items())},
                       "ranges": {k: list(v) for k, v in sorted(ranges.items())}}, sort_keys=True))
    for name, value in inputs.items():
        leaves, spec = pytree.tree_flatten(value)
        d.text(f"input {name} {spec}")
        dynamic = hints.get(name, {})
        for i, x in enumerate(leaves):
            if isinstance(x, torch.Tensor):
                if x.device.type != "cpu" or x.layout is not torch.strided:
                    raise Unfingerprintable(f"input {name} is a {x.layout} tensor on {x.device}")
                # a dynamic dim by name, but a size of 0 or 1 as itself: torch.export specialises those
                shape = [dynamic[axis] if axis in dynamic and n > 1 else n for axis, n in enumerate(x.shape)]
                d.text(f"{x.dtype} {shape} contiguous={x.is_contiguous()}")
            else:
                d.add(x, f"input {name}")
    d.add(target, type(target).__name__)
    # hooks every module call runs, the trace's included (cuvil/module_state.py watches them too)
    d.add([*torch_module._global_forward_pre_hooks.values(), *torch_module._global_forward_hooks.values()],
          "torch's global forward hooks")
    return ModelKey(d.structure(), d.tensors)


def model_key(call: ModelKey, options: dict) -> ModelKey:
    """The key of compiling that call with `options` (those that shape the code): the entry's."""
    d = Digest()
    d.text(call.name)
    d.add(options, "the compile options")
    return ModelKey(d.structure(), call.tensors, of_call=call)


def load_entry(key: ModelKey, args: tuple, kwargs: dict):
    """The cached variant for `key` if there is one that accepts the call (a `saved._SavedVariant`),
    else None. An entry that cannot be loaded is removed."""
    from .saved import load
    flush()
    path = entry_path(key.name)
    try:
        if not path.exists():
            return None
        saved = load(path)
    except CuvilError:
        path.unlink(missing_ok=True)
        return None
    except OSError:           # a cache folder this process may not read: no cache
        return None
    try:
        if saved.extra.get("weights") != key.weights():     # other weights: the compile rewrites the entry
            return None
    except Exception:         # bytes that cannot be read (a tensor view torch will not reinterpret)
        return None
    for v in saved.variants:
        hit = v.guard.match(args, kwargs)
        if hit is not None:
            return v
    return None


_writes: list[threading.Thread] = []        # entries being written (or written, not yet flushed)
_writes_lock = threading.Lock()             # guards the list: several threads may flush at once
_write_lock = threading.Lock()              # one write at a time: two of one entry share a partial file's name


def store_entry(key: ModelKey, variant, signature, model: str, phase: dict) -> None:
    """Write `variant` (of the model named `model`) under `key`, in a background thread. `phase`
    (the compile report's `model_cache_store`) gets the write's `time_s` when it ends, and an
    `error` saying why, where the entry is not written."""
    from .saved import save
    path = entry_path(key.name)
    size, limit = sum(t.nbytes for t in key.tensors), max_entry_bytes()
    if size > limit:
        phase["error"] = (f"not stored: the model's {size / 2**30:.2f} GiB of tensors are over the limit of "
                          f"{limit / 2**30:.2f} GiB an entry (${MAX_ENTRY_ENV})")
        return
    weights = key.weights()     # here, not in the thread: the weights the compile read (the import hashed them)

    def write() -> None:
        t = time.perf_counter()
        try:
            with _write_lock:
                path.parent.mkdir(parents=True, exist_ok=True)
                save(path, [variant], signature, extra={"weights": weights, "model": model})
        except Exception as e:    # the compile succeeded: a cache that cannot take it is no reason to fail
            phase["error"] = f"{type(e).__name__}: {e}"
        finally:
            phase["time_s"] = time.perf_counter() - t
    # not a daemon: the interpreter waits for it at exit, so an entry is never left half-written
    thread = threading.Thread(target=write, name="cuvil-model-cache-write")
    with _writes_lock:
        _writes.append(thread)
    thread.start()


def flush() -> None:
    """Wait until the entries being written are written."""
    with _writes_lock:
        pending = list(_writes)
    for thread in pending:
        thread.join()
    with _writes_lock:
        _writes[:] = [t for t in _writes if t.is_alive()]


@dataclass
class Entry:
    path: Path
    bytes: int
    written: float              # the file's modification time
    model: str                  # the class or function name it was compiled from


def entries() -> list[Entry]:
    """The cache's entries, the most recently written first."""
    flush()
    out = []
    for path in cache_root().glob("*/*.cuvil"):
        try:
            st = path.stat()
            manifest = json.loads(torch.load(path, mmap=True, weights_only=True)["manifest"])
        except Exception:     # being replaced, or not an entry: listed without its model
            manifest = {}
        out.append(Entry(path, st.st_size, st.st_mtime, manifest.get("extra", {}).get("model", "?")))
    return sorted(out, key=lambda e: -e.written)


def clear() -> int:
    """Remove every entry of the compiled-model cache; how many were removed."""
    flush()
    n = 0
    for path in cache_root().glob("*/*.cuvil"):
        path.unlink(missing_ok=True)
        n += 1
    return n

