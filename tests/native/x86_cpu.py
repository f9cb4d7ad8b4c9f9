"""What this x86 CPU runs, read from /proc/cpuinfo independently of the native library (whose own dispatch is what
the kernel-path tests check): the x86 kernel paths and which of them the CPU has."""

from __future__ import annotations

from pathlib import Path

X86_PATHS = ("avx2", "avx_vnni", "avx512_vnni")


def cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def has_path(path: str) -> bool:
    """This CPU runs kernel path `path` (generic: always; an arm64 or unknown path: never)."""
    f = cpu_flags()
    avx2 = {"avx", "avx2", "fma"} <= f
    return {"generic": True, "avx2": avx2, "avx_vnni": avx2 and "avx_vnni" in f,
            "avx512_vnni": avx2 and {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"} <= f}.get(path, False)
