"""The cell cache: re-running an unchanged `%%cuvil` cell shows the earlier compilation at once.

The key hashes the cell text, the option line, the versions of Python, torch and Cuvil, the
passes of the pipeline (a pass redefined in another cell is another class, so another key), and
every user variable the cell or its options read: a tensor by identity, shape, dtype and version
counter; anything else by the compiled-model cache's fingerprint (`cuvil.fingerprint`: its code,
attributes, submodules and the bytes of its tensors), so a model changed in place (new weights,
even through `.data`, a swapped submodule, a patched method) is compiled again. An object the
fingerprint cannot read counts by identity: after changing one in place, use `--force`. An entry
keeps those objects alive, so their ids cannot be reused while it exists.
"""
from __future__ import annotations

import ast
import hashlib
import re
import sys
from collections import OrderedDict
from typing import Any

import torch

import cuvil
from cuvil.fingerprint import Digest

from .run import CellRun

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def free_names(cell: str) -> set[str]:
    """Names the cell reads that it does not define itself (none for text that is not Python)."""
    try:
        tree = ast.parse(cell)
    except SyntaxError:
        return set()
    loaded, defined = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else defined).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.alias):
            defined.add((node.asname or node.name).split(".")[0])
    return loaded - defined


def _fingerprint(obj: Any) -> tuple:
    if isinstance(obj, torch.Tensor):
        return id(obj), tuple(obj.shape), str(obj.dtype), obj._version
    try:
        digest = Digest()
        digest.add(obj)
        return "contents", digest.hexdigest()
    except Exception:       # whatever stops the digest (see the module's text), identity is the key
        return id(obj), type(obj).__qualname__


def cell_key(cell: str, line: str, pipeline: cuvil.Pipeline, ns: dict, is_ir: bool) -> tuple[str, list]:
    """(hash of everything the compilation depends on, the user objects that went into it)."""
    names = set(_IDENT.findall(line)) | (set() if is_ir else free_names(cell))
    used = sorted((n, ns[n]) for n in names if n in ns)
    parts = [cell, line, sys.version, torch.__version__, cuvil.__version__,
             [(p.spec(), id(type(p))) for p in pipeline], [(n, _fingerprint(v)) for n, v in used]]
    return hashlib.sha256(repr(parts).encode()).hexdigest(), [v for _, v in used]


class CellCache:
    """The last `size` compilations, least recently used dropped first."""

    def __init__(self, size: int = 8):
        self.size = size
        self._entries: OrderedDict[str, tuple[CellRun, list]] = OrderedDict()

    def get(self, key: str) -> CellRun | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: str, run: CellRun, keepalive: list) -> None:
        self._entries[key] = (run, keepalive)
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
