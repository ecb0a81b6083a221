"""On-disk cache of compiled objects, per LLVM module and per model.

Each LLVM module (one per distinct kernel, and one for the GEMM loop nests several kernels share,
`jit.iter_units`) is an entry of its own, keyed on its text: a model that shares kernels with one
compiled before (the same layer at the same sizes, the same shared GEMM routine) compiles only the
modules that are new. A model's entry is an index of its modules' keys, keyed on its kernels'
identities (`jit.kernel_identity`: canonical text plus which nodes share a graph op), so a model
compiled before is found without building its LLVM IR at all.

Both keys are SHA-256 over the target (triple, CPU, features, ABI), the optimisation level,
Cuvil's version, llvmlite's and LLVM's, and a hash of the codegen sources themselves (so editing
the emitter never serves stale code). Under `$CUVIL_CACHE_DIR` (default `~/.cache/cuvil`): a
module's object `<key>.o` and its optimised LLVM IR `<key>.ll` (for the explain report; written
last, so an entry without it is incomplete), its assembly `<key>.s` once a report has shown it
(code generation again, which a later report of a model with that module skips), a model's index
`<key>.units`. Each file is written
atomically (a temporary file, renamed).
"""
from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import llvmlite
import llvmlite.binding as llvm

from .. import __version__
from .target import Target

_CODEGEN_SOURCES = ("kernel_ir.py", "kernel_text.py", "llvm_emit.py", "mathlib.py", "value_range.py", "panel_gemm.py",
                    "jit.py", "llvm_compile.py", "target.py")


@functools.cache
def _sources_hash() -> str:
    h = hashlib.sha256()
    here = Path(__file__).parent
    for name in _CODEGEN_SOURCES:
        h.update((here / name).read_bytes())
    return h.hexdigest()


def default_cache_dir() -> Path:
    env = os.environ.get("CUVIL_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "cuvil"


def _key(kind: str, texts, target: Target, opt_level: int) -> str:
    h = hashlib.sha256()
    for part in (kind, f"cuvil {__version__}", f"llvmlite {llvmlite.__version__}",
                 f"llvm {'.'.join(map(str, llvm.llvm_version_info))}", _sources_hash(), target.key(), f"O{opt_level}"):
        h.update(part.encode() + b"\0")
    for text in texts:
        h.update(text.encode() + b"\0")
    return h.hexdigest()


def cache_key(kernel_texts, target: Target, opt_level: int) -> str:
    """The key of a model's index: its kernels' identities, in any order."""
    return _key("model", sorted(kernel_texts), target, opt_level)


def unit_key(module_text: str, target: Target, opt_level: int) -> str:
    """The key of one LLVM module's object."""
    return _key("module", [module_text], target, opt_level)


@dataclass
class CacheEntry:
    objects: list[bytes]        # one per LLVM module
    llvm_ir: list[str]          # the optimised text of each module
    units: list[str]            # each module's key (`unit_key`)


class ObjectCache:
    """Compiled objects by key. `hits` and `misses` count the model lookups made through this
    instance, `units_reused` the modules a model that missed found compiled before."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else default_cache_dir()
        self.hits = 0
        self.misses = 0
        self.units_reused = 0

    def _path(self, key: str, suffix: str) -> Path:
        return self.root / key[:2] / f"{key}{suffix}"

    def load(self, key: str) -> CacheEntry | None:
        """The model's entry: its index, then each module it names (None if any is missing)."""
        try:
            units = self._path(key, ".units").read_text().split()
        except OSError:
            units = None
        found = [self.load_unit(u) for u in units or ()]
        if not units or None in found:
            self.misses += 1
            return None
        self.hits += 1
        return CacheEntry([obj for obj, _ in found], [ir for _, ir in found], units)

    def load_unit(self, key: str) -> tuple[bytes, str] | None:
        """One module's object and optimised IR."""
        try:
            return self._path(key, ".o").read_bytes(), self._path(key, ".ll").read_text()
        except OSError:
            return None

    def store_unit(self, key: str, obj: bytes, llvm_ir: str) -> None:
        self._write(key, ".o", obj)
        self._write(key, ".ll", llvm_ir.encode())     # last: with it, the entry is complete

    def load_assembly(self, key: str) -> str | None:
        """The module's assembly, kept once a report has shown it (`jit.CompiledKernels.asm`)."""
        try:
            return self._path(key, ".s").read_text()
        except OSError:
            return None

    def store_assembly(self, key: str, text: str) -> None:
        self._write(key, ".s", text.encode())

    def store(self, key: str, entry: CacheEntry) -> None:
        """The model's index (its modules are stored as they are compiled)."""
        self._write(key, ".units", "\n".join(entry.units).encode())

    def files(self) -> list[Path]:
        """Every file of the object cache (the compiled-model cache's folder, `models`, is not
        its)."""
        return [f for f in self.root.glob("[0-9a-f][0-9a-f]/*") if f.is_file()]

    def clear(self) -> int:
        """Remove every file of the object cache; how many were removed."""
        files = self.files()
        for f in files:
            f.unlink(missing_ok=True)
        return len(files)

    def _write(self, key: str, suffix: str, data: bytes) -> None:
        folder = self._path(key, "").parent
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, self._path(key, suffix))
