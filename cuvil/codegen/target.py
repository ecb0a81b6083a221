"""Target machines: the host CPU (for the JIT) or a cross triple (objects and assembly only)."""
from __future__ import annotations

import functools
import threading
from dataclasses import dataclass

import llvmlite.binding as llvm

from ..errors import CuvilError
from . import llvm_compile

_init_lock = threading.Lock()
_initialised = set()


def init_llvm(all_targets: bool = False) -> None:
    """Register LLVM's native target (or all targets) once per process."""
    with _init_lock:
        wanted = "all" if all_targets else "native"
        if wanted not in _initialised:
            llvm_compile.init_llvm(all_targets)
            _initialised.update({"native", wanted})


@dataclass(frozen=True)
class Target:
    """What code is generated for. `host()` is the machine Cuvil runs on; `cross(arch)` presets
    other architectures (code for them can be emitted and inspected but not run here)."""
    triple: str
    cpu: str
    features: str
    abiname: str = ""

    @staticmethod
    def host() -> "Target":
        return _host()

    @staticmethod
    def cross(arch: str) -> "Target":
        try:
            return CROSS_TARGETS[arch]
        except KeyError:
            raise CuvilError(f"unknown cross target '{arch}' (known: {', '.join(CROSS_TARGETS)}; or build a "
                             f"Target(triple, cpu, features) yourself)") from None

    @property
    def is_host(self) -> bool:
        return self == Target.host()

    @property
    def arch(self) -> str:
        return self.triple.split("-")[0]

    def has_feature(self, feature: str) -> bool:
        return f"+{feature}" in self.features.split(",")

    def key(self) -> str:
        return f"{self.triple}|{self.cpu}|{self.features}|{self.abiname}"

    def target_machine(self, opt: int = 3, jit: bool = False) -> llvm.TargetMachine:
        """A fresh TargetMachine (MCJIT and LLJIT take ownership of the one they are given)."""
        init_llvm(all_targets=not jit and self.arch != Target.host().arch)
        try:
            return llvm_compile.target_machine(self.triple, self.cpu, self.features, self.abiname, opt, jit)
        except RuntimeError as e:
            raise CuvilError(f"LLVM has no target for triple '{self.triple}': {e}") from None

    @property
    def vector_floats(self) -> int:
        """f32 lanes of the vectors Cuvil's hand-blocked loops use: 16 with AVX-512, 8 on other
        x86-64 (AVX2), 4 elsewhere (NEON; RISC-V V at its 128-bit minimum)."""
        if self.has_feature("avx512f"):
            return 16
        return 8 if self.arch == "x86_64" else 4

    @property
    def vector_registers(self) -> int:
        return 16 if self.arch == "x86_64" and not self.has_feature("avx512f") else 32

    @property
    def panel_width(self) -> int:
        """The widest panel the `layout` pass packs a weight in (`ir.ops.nn.panel_width`): 64 columns
        with 16-float vectors (a 6 x 64 block of C in 24 of the 32 registers), 16 with narrower ones
        (their microkernel then keeps 6 x 16 or 3 x 16 blocks of C in registers)."""
        return 64 if self.vector_floats >= 16 else 16

    def __str__(self) -> str:
        return f"{self.triple} ({self.cpu})"


@functools.cache
def _host() -> Target:
    init_llvm()
    features = llvm.get_host_cpu_features().flatten()
    if "+avx512f" in features.split(","):
        # LLVM keeps to 256-bit vectors on AVX-512 CPUs unless told otherwise (old parts lowered their
        # clock for 512-bit code); Cuvil's kernels are long vector loops, which gain from the width
        features += ",-prefer-256-bit"
    return Target(llvm.get_process_triple(), llvm.get_host_cpu_name(), features)


CROSS_TARGETS = {
    "aarch64": Target("aarch64-unknown-linux-gnu", "generic", "+neon"),
    "riscv64": Target("riscv64-unknown-linux-gnu", "generic-rv64", "+m,+a,+f,+d,+c,+v", abiname="lp64d"),
    "x86_64": Target("x86_64-unknown-linux-gnu", "x86-64-v3", ""),
}
