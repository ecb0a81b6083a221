"""Deliberately broken user passes, to show how cuvil-opt reports them."""
from cuvil.ir import DType
from cuvil.passes import register_pass


@register_pass("retype-relu")
def retype_relu(module):
    """Gives every relu an i32 result type without changing anything else (invalid IR)."""
    for fn in module.functions.values():
        for op in fn.ops:
            if op.name == "cuvil.relu":
                op.result.type = op.result.type.with_dtype(DType.i32)


@register_pass("crash")
def crash(module):
    """Fails with an internal error."""
    return {}["missing"]
