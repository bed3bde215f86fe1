"""Whether a device multiplies bf16 in hardware: CPUs with amx_bf16 or avx512_bf16, GPUs of
compute capability 8.0 (Ampere) or later. Elsewhere torch emulates bf16 and a bf16 run is
several times slower than fp32 (docs/benchmarks.md), so a run asking for it is told once."""

import contextlib
import logging
from typing import Optional

import torch

logger = logging.getLogger(__name__)

CPU_FLAGS = ("amx_bf16", "avx512_bf16")
CPUINFO = "/proc/cpuinfo"


def read_cpuinfo() -> str:
    """/proc/cpuinfo's text ('' where there is none)."""
    with contextlib.suppress(OSError):
        with open(CPUINFO) as f:
            return f.read()
    return ""


def cpu_bf16_flags(cpuinfo: str) -> Optional[list]:
    """The bf16 matrix flags of /proc/cpuinfo's text; None when it lists no flags (not
    Linux, or unreadable): unknown, not absent."""
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            return [flag for flag in CPU_FLAGS if flag in flags]
    return None


def missing_bf16_units(cuda: bool) -> Optional[str]:
    """Why the device a run uses has no bf16 matrix units, or None (it has them, or that is
    unknown)."""
    if cuda:
        major, minor = torch.cuda.get_device_capability()
        return None if major >= 8 else \
            f"this GPU ({torch.cuda.get_device_name()}) is compute capability {major}.{minor}, " \
            f"before Ampere's 8.0"
    return None if cpu_bf16_flags(read_cpuinfo()) != [] else \
        f"this CPU has neither {' nor '.join(CPU_FLAGS)}"


def warn_if_emulated(flag: str, cuda: bool) -> None:
    """One warning when ``flag`` (a bf16 precision option) runs on emulated bf16."""
    why = missing_bf16_units(cuda)
    if why:
        logger.warning(f"{flag}: {why}, so bf16 is emulated and slower than fp32 (several "
                       f"times); train in fp32 (no precision flag)"
                       f"{' or with --fp16' if cuda else ''} here (docs/long_runs.md, "
                       f"\"Which one\")")
