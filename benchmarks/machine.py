"""What the numbers were measured on, and how busy the rest of the machine was meanwhile."""
from __future__ import annotations

import importlib.metadata
import os
import platform
import time
from pathlib import Path

PACKAGES = ("torch", "onnxruntime", "onnx", "onnxscript", "llvmlite", "numpy", "transformers", "cuvil")


def _cpuinfo_field(text: str, key: str) -> str | None:
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == key:
            return value.strip()
    return None


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info() -> dict:
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    flags = (_cpuinfo_field(cpuinfo, "flags") or "").split()
    meminfo = Path("/proc/meminfo").read_text() if Path("/proc/meminfo").exists() else ""
    mem_kb = _cpuinfo_field(meminfo, "MemTotal")
    return {
        "cpu_model": _cpuinfo_field(cpuinfo, "model name") or platform.processor() or None,
        "cpu_mhz": _cpuinfo_field(cpuinfo, "cpu MHz"),
        "simd": [f for f in ("sse4_2", "avx", "avx2", "fma", "avx512f") if f in flags],
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gib": round(int(mem_kb.split()[0]) / 2**20, 1) if mem_kb else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": {p: _version(p) for p in PACKAGES},
    }


def load_average() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def _system_busy_ticks() -> int:
    # cpu  user nice system idle iowait irq softirq steal ...: busy = all but idle and iowait
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return sum(fields) - fields[3] - fields[4]


def _process_ticks(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:      # exited meanwhile
        return 0
    after_name = stat.rsplit(")", 1)[1].split()
    return int(after_name[11]) + int(after_name[12])     # utime + stime, all threads


class OtherLoad:
    """Cores used by processes other than `pids` between construction and `cores()`: the whole
    system's busy time (hypervisor steal included) minus our own. None where /proc is missing."""

    def __init__(self, pids: list[int]):
        self.pids = pids
        self.available = Path("/proc/stat").exists()
        self.start = self._sample() if self.available else None

    def _sample(self) -> tuple[float, int, int]:
        return time.monotonic(), _system_busy_ticks(), sum(_process_ticks(p) for p in self.pids)

    def cores(self) -> float | None:
        if not self.available:
            return None
        (w0, busy0, ours0), (w1, busy1, ours1) = self.start, self._sample()
        ticks = (busy1 - busy0) - (ours1 - ours0)
        return max(0.0, ticks / os.sysconf("SC_CLK_TCK") / max(w1 - w0, 1e-9))


def wait_for_quiet(pids: list[int], max_s: float, threshold: float, window_s: float = 0.2) -> float:
    """Wait until other processes use fewer than `threshold` cores over a `window_s` window, for
    at most `max_s`; returns the seconds waited. Two-thread runs stall badly on a busy 2-core box."""
    waited = 0.0
    while waited + window_s <= max_s:
        load = OtherLoad(pids)
        if not load.available:
            break
        time.sleep(window_s)
        waited += window_s
        if load.cores() < threshold:
            break
    return waited
