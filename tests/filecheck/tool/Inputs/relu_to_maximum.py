"""A user pass, registered from Python the way a notebook cell would: it rewrites relu(x) to
maximum(x, 0.0) and reports how many it rewrote."""
from cuvil.passes import register_pass
from cuvil.passes.rewrite import Rewriter


@register_pass("relu-to-maximum", requires={"verified"})
def relu_to_maximum(module, limit: int = 100):
    count = 0
    for fn in module.functions.values():
        rw = Rewriter(module, fn)
        for op in [op for op in fn.ops if op.name == "cuvil.relu"][:limit]:
            zero = rw.create(op, "cuvil.literal", attrs={"value": 0.0, "dtype": op.result.type.dtype})
            new = rw.create(op, "cuvil.maximum", [op.operands[0], zero.result])
            rw.replace(op, new.results)
            count += 1
    return {"rewritten": count}
