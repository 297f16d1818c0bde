"""What this machine's CPU can do: the feature flags the kernel reports (``/proc/cpuinfo``).

Read by the engine (bf16 autocast only where the CPU multiplies bf16 natively, engine/train/precision.py), by
compression (7-bit ONNX weights where the CPU lacks VNNI, compress/onnx.py) and by the benchmarks, which
print the flags beside every figure.
"""
from __future__ import annotations


def cpu_flags() -> list:
    """All flags /proc/cpuinfo lists for this CPU (x86 ``flags`` or ARM ``Features``; [] where it cannot be
    read, e.g. on macOS or Windows)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].split()
    except OSError:
        pass
    return []


__all__ = ["cpu_flags"]
