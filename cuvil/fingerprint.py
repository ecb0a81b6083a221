"""Fingerprints: a digest of what a traced model's graph depends on, for the compiled-model cache.

torch.export's graph is a function of the model's code, its state and the call's shapes. The digest
covers, by kind of object reached from the model (attributes, globals its code names, closures):
- code outside installed packages (the user's files, notebook cells, editable checkouts): the
  code objects themselves (`marshal`, so bytecode, constants and line numbers), their defaults
  and closures, and every global they name, followed transitively;
- installed packages (torch, transformers, ... under site-packages), the standard library and
  builtins: the qualified name plus the package's version (or the file's contents where the
  version is unknown), without reading their code;
- tensors: dtype, shape, strides and the bytes;
- modules' and other objects' attributes, recursively; plain values by value.

What it cannot see: state read outside those paths (environment variables, a module-level value
of an installed package changed at run time, files read by the model). An object it has no rule
for (a C extension's instance, a tensor off the CPU) raises `Unfingerprintable` naming where it
is, and the compile goes the long way.
"""
from __future__ import annotations

import collections
import dis
import enum
import functools
import hashlib
import importlib.metadata
import marshal
import os
import re
import sys
import types
from pathlib import Path

import torch

MAX_OBJECTS = 200_000         # a walk that meets more objects than this gives up (not worth caching)

_CUVIL = os.path.dirname(os.path.realpath(__file__)) + os.sep
_STDLIB = os.path.realpath(os.path.dirname(os.__file__)) + os.sep
_INSTALLED = re.compile(r"[/\\](site|dist)-packages[/\\]")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


class Unfingerprintable(Exception):
    """The model reaches something whose contents cannot be digested: no cache for it."""


def contents_digest(tensors: list[torch.Tensor]) -> str:
    """SHA-256 over the bytes of `tensors` in order."""
    h = hashlib.sha256()
    for t in tensors:
        data = t.detach().contiguous()
        if data.numel():
            h.update(memoryview(data.reshape(-1).view(torch.uint8).numpy()))
    return h.hexdigest()


@functools.cache
def _origin(path: str) -> str | None:
    """How code from `path` is identified: None for code the digest reads (the user's), else
    `python X.Y` (standard library), `pkg==version` (installed), or the file's SHA-256."""
    if path.startswith("<frozen") or path == "<built-in>":
        return f"python {sys.version}"
    real = os.path.realpath(path)
    if real.startswith(_CUVIL):
        return f"cuvil {cuvil_digest()}"
    if real.startswith(_STDLIB) and not _INSTALLED.search(real[len(_STDLIB) - 1:]):
        return f"python {sys.version}"
    m = _INSTALLED.search(real)
    if m is None:
        return None
    package = re.split(r"[/\\]", real[m.end():])[0].removesuffix(".py")
    return _package_version(package) or _file_digest(real)


@functools.cache
def _package_version(package: str) -> str | None:
    version = getattr(sys.modules.get(package), "__version__", None)
    if isinstance(version, str):
        return f"{package}=={version}"
    try:
        return f"{package}=={importlib.metadata.version(package)}"
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None


@functools.cache
def cuvil_digest() -> str:
    """Cuvil's own code: the path, size and modification time of every source file of the package
    and of the native module (what Python's own .pyc check compares)."""
    from . import __version__, _native
    h = hashlib.sha256(__version__.encode())
    for path in sorted(Path(_CUVIL).rglob("*.py")) + [Path(_native.__file__)]:
        st = path.stat()
        h.update(f"{path} {st.st_size} {st.st_mtime_ns}\0".encode())
    return h.hexdigest()


def _file_digest(path: str) -> str:
    try:
        return "file " + hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        raise Unfingerprintable(f"cannot read {path}") from None


def _defined_in(name: str | None) -> str | None:
    """The origin (as `_origin`) of what module `name` defines; None for the user's code, including
    `__main__` and modules built at run time."""
    if name in sys.builtin_module_names or name == "builtins":
        return f"python {sys.version}"
    module = sys.modules.get(name or "")
    path = getattr(module, "__file__", None)
    return None if path is None or name == "__main__" else _origin(path)


class Digest:
    """A SHA-256 over the objects given to `add`, in order, in two parts: `structure()` (everything
    but the bytes of tensors: their dtypes, shapes and strides are in it) and `tensors` (whose bytes
    `contents_digest` hashes, apart, only when needed); `hexdigest()` is both.
    `path` is where the walk is, for the error that names what could not be digested."""

    def __init__(self):
        self._parts: list[str] = []
        self.tensors: list[torch.Tensor] = []
        self._seen: dict[int, int] = {}
        self._alive: list = []         # keeps every visited object alive: ids stay unique
        self.path: list = []          # attribute names and keys from the root to where the walk is

    def structure(self) -> str:
        return hashlib.sha256("\0".join(self._parts).encode()).hexdigest()

    def hexdigest(self) -> str:
        return hashlib.sha256((self.structure() + contents_digest(self.tensors)).encode()).hexdigest()

    def text(self, s: str) -> None:
        self._parts.append(s)

    def add(self, obj, where=None) -> None:
        """Digest `obj`, reached from the previous object through `where` (a name or a key)."""
        self.path.append(where)
        try:
            self._add(obj)
        except Unfingerprintable as e:
            if not getattr(e, "located", False):
                e.args = (f"{e.args[0]} (at {_where(self.path)})",)
                e.located = True
            raise
        finally:
            self.path.pop()

    def _add(self, obj) -> None:
        if type(obj) in _PLAIN or isinstance(obj, _PLAIN):
            self.text(f"{type(obj).__qualname__} {obj!r}")
            return
        if type(obj) in _CONTAINER_TYPES and not obj:     # the many empty hook dicts of a module
            self.text(f"{type(obj).__qualname__} 0")
            return
        if id(obj) in self._seen:       # shared or cyclic: a reference to the first visit
            self.text(f"ref {self._seen[id(obj)]}")
            return
        self._seen[id(obj)] = len(self._seen)
        self._alive.append(obj)
        if len(self._seen) > MAX_OBJECTS:
            raise Unfingerprintable(f"more than {MAX_OBJECTS} objects")
        if isinstance(obj, torch.Tensor):
            if type(obj) not in _DENSE:      # fake, functional and other subclasses hold no bytes to read
                raise Unfingerprintable(f"a {type(obj).__name__}")
            if obj.device.type != "cpu" or obj.layout is not torch.strided or obj.is_quantized:
                raise Unfingerprintable(f"a {obj.layout} tensor on {obj.device}")
            self.text(f"tensor {len(self.tensors)} {obj.dtype} {tuple(obj.shape)} {obj.stride()}")
            self.tensors.append(obj)
        elif isinstance(obj, (tuple, list)):
            self.text(f"{type(obj).__qualname__} {len(obj)}")
            for i, x in enumerate(obj):
                if type(x) in _PLAIN:
                    self.text(f"{type(x).__qualname__} {x!r}")
                else:
                    self.add(x, i)
        elif isinstance(obj, dict):
            self.text(f"{type(obj).__qualname__} {len(obj)}")
            for k, v in obj.items():
                if type(k) in _PLAIN:
                    self.text(f"{type(k).__qualname__} {k!r}")
                else:
                    self.add(k)
                if type(v) in _PLAIN:
                    self.text(f"{type(v).__qualname__} {v!r}")
                else:
                    self.add(v, (k,))
        elif isinstance(obj, (set, frozenset)):
            parts = []
            for x in obj:
                d = Digest()
                d.add(x)
                parts.append(d.hexdigest())
            self.text(f"set {sorted(parts)}")
        elif isinstance(obj, types.ModuleType):
            self._module(obj)
        elif isinstance(obj, types.FunctionType):
            self._function(obj)
        elif isinstance(obj, types.MethodType):
            self.add(obj.__func__, "__func__")
            self.add(obj.__self__, "__self__")
        elif isinstance(obj, functools.partial):
            self.add((obj.func, obj.args, obj.keywords), "partial")
        elif isinstance(obj, type):
            self._class(obj)
        elif isinstance(obj, types.CodeType):
            self._code(obj)
        elif isinstance(obj, (types.BuiltinFunctionType, types.MethodWrapperType, types.WrapperDescriptorType,
                              types.MethodDescriptorType, torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
            self.text(f"builtin {getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', repr(obj))}")
        else:
            self._instance(obj)

    def _module(self, m: types.ModuleType) -> None:
        path = getattr(m, "__file__", None)
        if path is None and m.__name__ not in sys.builtin_module_names:
            raise Unfingerprintable(f"module {m.__name__} has no source file")
        origin = f"python {sys.version}" if path is None else _origin(path)
        self.text(f"module {m.__name__} {origin or _file_digest(path)}")

    def _function(self, fn: types.FunctionType) -> None:
        origin = _origin(fn.__code__.co_filename)
        self.text(f"function {fn.__module__}.{fn.__qualname__}")
        if origin is not None:
            self.text(origin)
            return
        self._code(fn.__code__)
        self.add(fn.__defaults__, "__defaults__")
        self.add(fn.__kwdefaults__, "__kwdefaults__")
        self.add(fn.__annotations__, "__annotations__")
        if fn.__closure__:
            for name, cell in zip(fn.__code__.co_freevars, fn.__closure__):
                try:
                    value = cell.cell_contents
                except ValueError:      # a cell not yet filled
                    value = None
                self.add(value, name)
        for name in sorted(global_names(fn.__code__)):
            if name in fn.__globals__:
                self.add(fn.__globals__[name], name)

    def _code(self, code: types.CodeType) -> None:
        self.text(hashlib.sha256(marshal.dumps(code)).hexdigest())

    def _class(self, cls: type) -> None:
        origin = _defined_in(cls.__module__)
        self.text(f"class {cls.__module__}.{cls.__qualname__}")
        if origin is not None:
            self.text(origin)
            for name, value in vars(cls).items():      # a method patched in from the user's code
                if isinstance(value, types.FunctionType) and _origin(value.__code__.co_filename) is None:
                    self.add(value, name)
            return
        self.add(cls.__bases__, "__bases__")
        for name, value in vars(cls).items():
            if name not in ("__dict__", "__weakref__", "__doc__", "__module__"):
                self.add(value, name)

    def _instance(self, obj) -> None:
        cls = type(obj)
        self.add(cls, "__class__")
        if isinstance(obj, (staticmethod, classmethod)):
            self.add(obj.__func__, "__func__")
        elif isinstance(obj, property):
            self.add((obj.fget, obj.fset, obj.fdel), "property")
        elif hasattr(obj, "__dict__") or hasattr(cls, "__slots__"):
            state = dict(vars(obj)) if hasattr(obj, "__dict__") else {}
            for slot in _slots(cls):
                if hasattr(obj, slot):
                    state[slot] = getattr(obj, slot)
            self.add(state, "__dict__")
        elif _defined_in(cls.__module__) is not None:
            # a standard-library or installed type with no Python-level state (a lock, a
            # generator): its kind is all that can matter to tracing
            try:
                self.text(_ADDRESS.sub("", repr(obj)))
            except Exception as e:
                raise Unfingerprintable(f"a {cls.__qualname__} whose repr fails ({type(e).__name__})") from None
        else:
            raise Unfingerprintable(f"a {cls.__qualname__} without readable state")


_PLAIN = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size, enum.Enum)
_DENSE = (torch.Tensor, torch.nn.Parameter)
_CONTAINER_TYPES = {tuple, list, dict, set, frozenset, collections.OrderedDict}


def _where(path: list) -> str:
    """`BertModel.encoder.layer[0].attention`-like text for a walk's path: its steps are attribute
    names (str), list indices (int) and dict keys (1-tuples)."""
    out, after = "", None
    for step in path:
        if isinstance(step, tuple):
            key = step[0]
            out += f".{key}" if after in _CONTAINERS and isinstance(key, str) else f"[{key!r}]"
        elif isinstance(step, int):
            out += f"[{step}]"
        elif step is not None and step not in _CONTAINERS:
            out += f".{step}"
        after = step[0] if isinstance(step, tuple) else step
    return out.lstrip(".") or "the model"


_CONTAINERS = ("__dict__", "_modules", "_parameters", "_buffers")    # left out of a path's text


def _slots(cls: type) -> list[str]:
    out = []
    for c in cls.__mro__:
        slots = c.__dict__.get("__slots__", ())
        out += [slots] if isinstance(slots, str) else [s for s in slots if s not in ("__dict__", "__weakref__")]
    return out


def global_names(code: types.CodeType) -> set[str]:
    """The global (or module-level) names `code` and the code nested in it load; not the other
    names in co_names (`x.values` names `values`, which a global of that name must not stand for)."""
    names = {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= global_names(c)
    return names


def is_user_code(path: str) -> bool:
    """Whether code from `path` is the user's (not an installed package's, the standard library's or Cuvil's)."""
    return _origin(path) is None
