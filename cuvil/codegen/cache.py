"""On-disk cache of compiled objects.

The key is a SHA-256 over the kernels' identities (`jit.kernel_identity`: canonical text plus which
nodes share a graph op), the target (triple, CPU, features, ABI),
the optimisation level, Cuvil's version, llvmlite's version and LLVM's, and a hash of the codegen
sources themselves (so editing the emitter never serves stale code). An entry is two files under
`$CUVIL_CACHE_DIR` (default `~/.cache/cuvil`): `<key>.o` (the object) and `<key>.ll` (the
optimised LLVM IR, for the explain report). Writes are atomic (write to a temporary file, rename).
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

_CODEGEN_SOURCES = ("kernel_ir.py", "kernel_text.py", "llvm_emit.py", "mathlib.py", "jit.py", "target.py")


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


def cache_key(kernel_texts, target: Target, opt_level: int) -> str:
    h = hashlib.sha256()
    for part in (f"cuvil {__version__}", f"llvmlite {llvmlite.__version__}",
                 f"llvm {'.'.join(map(str, llvm.llvm_version_info))}", _sources_hash(), target.key(), f"O{opt_level}"):
        h.update(part.encode() + b"\0")
    for text in sorted(kernel_texts):
        h.update(text.encode() + b"\0")
    return h.hexdigest()


@dataclass
class CacheEntry:
    obj: bytes
    llvm_ir: str


class ObjectCache:
    """Compiled objects by key. `hits` and `misses` count lookups made through this instance."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else default_cache_dir()
        self.hits = 0
        self.misses = 0

    def _path(self, key: str, suffix: str) -> Path:
        return self.root / key[:2] / f"{key}{suffix}"

    def load(self, key: str) -> CacheEntry | None:
        try:
            entry = CacheEntry(self._path(key, ".o").read_bytes(), self._path(key, ".ll").read_text())
        except OSError:
            self.misses += 1
            return None
        self.hits += 1
        return entry

    def store(self, key: str, entry: CacheEntry) -> None:
        folder = self._path(key, "").parent
        folder.mkdir(parents=True, exist_ok=True)
        # the .ll goes first: a present .o means a complete entry
        for suffix, data in ((".ll", entry.llvm_ir.encode()), (".o", entry.obj)):
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, self._path(key, suffix))
