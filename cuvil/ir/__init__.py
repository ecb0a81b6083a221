"""Graph IR: types, the object model, op declarations, text form, verifier and interpreter."""
from .types import DType, TensorType, Dim, sym, dim_str
from .core import (Attr, Builder, Function, Loc, Module, OpDef, Operation, Value, lookup_op, optional,
                   register_op, required, OP_REGISTRY)
from . import ops  # registers the built-in ops
from .printer import print_function, print_module, print_op
from .parser import parse, parse_file
from .verifier import verify
from .interpreter import interpret
from .custom import custom_op
