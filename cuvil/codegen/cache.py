"""On-disk cache of compiled objects.

The key is a SHA-256 over the kernels' identities (`jit.kernel_identity`: canonical text plus which
nodes share a graph op), the target (triple, CPU, features, ABI),
the optimisation level, Cuvil's version, llvmlite's version and LLVM's, and a hash of the codegen
sources themselves (so editing the emitter never serves stale code). An entry is the objects the
kernels were compiled into (one per process that compiled a share, `jit._compile_objects`), under
`$CUVIL_CACHE_DIR` (default `~/.cache/cuvil`): `<key>.<i>.o` (an object) and `<key>.<i>.ll` (its
optimised LLVM IR, for the explain report), then `<key>.parts` (how many). Each file is written
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

_CODEGEN_SOURCES = ("kernel_ir.py", "kernel_text.py", "llvm_emit.py", "mathlib.py", "panel_gemm.py", "jit.py",
                    "llvm_compile.py", "target.py")


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
    objects: list[bytes]
    llvm_ir: list[str]          # the optimised module of each object


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
            n = int(self._path(key, ".parts").read_text())
            entry = CacheEntry([self._path(key, f".{i}.o").read_bytes() for i in range(n)],
                               [self._path(key, f".{i}.ll").read_text() for i in range(n)])
        except (OSError, ValueError):
            self.misses += 1
            return None
        self.hits += 1
        return entry

    def store(self, key: str, entry: CacheEntry) -> None:
        folder = self._path(key, "").parent
        folder.mkdir(parents=True, exist_ok=True)
        # `.parts` (how many objects) goes last: when it is there, the entry is complete
        files = [(f".{i}{suffix}", data) for i, (obj, ir) in enumerate(zip(entry.objects, entry.llvm_ir))
                 for suffix, data in ((".ll", ir.encode()), (".o", obj))]
        for suffix, data in files + [(".parts", str(len(entry.objects)).encode())]:
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, self._path(key, suffix))
