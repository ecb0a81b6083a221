"""cuvil-kernel: look at what the code generator makes of kernel IR or graph IR.

    python -m cuvil.codegen.tool FILE [--emit=kernel|llvm|llvm-opt|asm] [--target=host|aarch64|riscv64|x86_64]

FILE is kernel IR (`.kir`) or graph IR (`.cvl`, lowered first with the default grouping); `-`
reads stdin. `--emit=kernel` prints the kernel IR (parsed and printed back: a round trip),
`llvm` the LLVM module before optimisation, `llvm-opt` after O3, `asm` the target's assembly.
"""
from __future__ import annotations

import argparse
import sys

from ..errors import CuvilError
from .jit import build_module, emit, optimize
from .kernel_ir import verify_kernel
from .kernel_text import parse_kernels, print_kernels
from .target import Target


def load_kernels(text: str, filename: str, target: Target):
    """Kernel IR, or graph IR lowered for `target` (its GEMM panel width)."""
    if filename.endswith(".cvl") or text.lstrip().startswith("cuvil.func"):
        from ..ir import parse, verify
        from .lower import lower_function
        module = parse(text, filename)
        verify(module)
        return [lk.kernel for fn in module.functions.values()
                for lk in lower_function(fn, panel_width=target.panel_width)]
    return parse_kernels(text, filename)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="cuvil-kernel", description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--emit", choices=("kernel", "llvm", "llvm-opt", "asm"), default="kernel")
    ap.add_argument("--target", default="host")
    args = ap.parse_args(argv)
    try:
        text = sys.stdin.read() if args.file == "-" else open(args.file).read()
        target = Target.host() if args.target == "host" else Target.cross(args.target)
        kernels = load_kernels(text, "<stdin>" if args.file == "-" else args.file, target)
        for k in kernels:
            verify_kernel(k)
        if args.emit == "kernel":
            sys.stdout.write(print_kernels(kernels))
            return 0
        # readable symbols here: each kernel under its own name (the JIT uses structural hashes), and
        # no debug locations (they map report lines to graph ops, which a kernel file does not have)
        mod = build_module(kernels, {k.name: k.name for k in kernels}, target, debug=False)
        if args.emit != "llvm":
            tm = target.target_machine()
            mod.data_layout = str(tm.target_data)
            optimize(mod, tm)
        sys.stdout.write(emit(target, mod, assembly=True, tm=tm) if args.emit == "asm" else str(mod))
        return 0
    except (CuvilError, OSError) as e:
        print(f"cuvil-kernel: {e}", file=sys.stderr)
        return 1

if __name__ == "__main__":
    sys.exit(main())
