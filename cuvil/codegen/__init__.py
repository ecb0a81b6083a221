"""Code generation: kernel IR, lowering from graph IR, LLVM emission, target machines, JIT and the
object cache (docs/codegen.md)."""
from .cache import ObjectCache
from .jit import CompiledKernels, compile_function, compile_kernels
from .kernel_ir import Buffer, Kernel, verify_kernel
from .kernel_text import parse_kernel, parse_kernels, print_kernel, print_kernels
from .lower import LoweredKernel, lower_function, lower_group
from .target import Target

__all__ = ["Buffer", "CompiledKernels", "Kernel", "LoweredKernel", "ObjectCache", "Target", "compile_function",
           "compile_kernels", "lower_function", "lower_group", "parse_kernel",
           "parse_kernels", "print_kernel", "print_kernels", "verify_kernel"]
