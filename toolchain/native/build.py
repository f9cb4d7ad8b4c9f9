"""Build and load the native kernel library for this host (g++ against the executorch wheel).

The library is compiled once per (source and its kernels*.h headers, flags, compiler, executorch version)
into a cache directory ($TOOLCHAIN_KERNEL_CACHE, default ~/.cache/toolchain/kernels/<key>/), written
atomically (a temp file, then rename), and loaded with RTLD_GLOBAL: its static initializer registers
`toolchain::int4_linear_a8.out` with the ExecuTorch runtime the Python bindings share (as
`libexecutorch_kernels_quantized.so` registers its kernels). `-march=native` picks this host's vector width
(AVX2 or AVX-512 here); on arm64 one build holds the neon, dotprod and i8mm paths, chosen at run time
(kernels_arm64.h). The summation order is the source's (16 lanes), not the width's.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from toolchain.errors import ToolchainError

__all__ = ["KERNEL_OPS", "KERNEL_SOURCE", "KernelUnavailable", "kernel_library", "load_kernels", "compile_flags"]

KERNEL_SOURCE = Path(__file__).with_name("kernels.cpp")
KERNEL_OPS = ("toolchain::int4_linear_a8.out", "toolchain::attention_decode.out", "toolchain::rms_norm.out",
              "toolchain::lora_linear_a8.out", "toolchain::rope_heads.out", "toolchain::swiglu.out")  # what it registers
_LIB_NAME = "libtoolchain_kernels.so"


class KernelUnavailable(ToolchainError):
    """The native kernels cannot be built or loaded here (no C++ compiler, no executorch wheel)."""


def compile_flags() -> list[str]:
    return ["-std=c++17", "-O3", "-march=native", "-ffp-contract=fast", "-fPIC", "-shared",
            "-Wno-deprecated-declarations", "-DC10_USING_CUSTOM_GENERATED_MACROS"]


def _executorch_dir() -> Path:
    try:
        import executorch
    except ImportError as e:  # pragma: no cover - executorch is a dependency
        raise KernelUnavailable(f"the executorch package is not importable ({e})") from None
    return Path(executorch.__path__[0])


def _compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise KernelUnavailable("no C++ compiler found (g++ or $CXX) to build the int4 generation kernel")
    return cxx


def _key(cxx: str) -> str:
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise KernelUnavailable(f"the C++ compiler {cxx} does not run ({e})") from None
    import importlib.metadata

    h = hashlib.sha256()
    headers = sorted(KERNEL_SOURCE.parent.glob("kernels*.h"))   # included by kernels.cpp (kernels_arm64.h, ...)
    for part in (KERNEL_SOURCE.read_bytes(), *(f.read_bytes() for f in headers), " ".join(compile_flags()).encode(),
                 version.encode(), importlib.metadata.version("executorch").encode()):
        h.update(part)
        h.update(b"\0")
    return h.hexdigest()[:16]


def kernel_library() -> Path:
    """The built library for this host (built now if the cache lacks it).

    Raises:
        KernelUnavailable: no compiler, or the build failed (its first error lines in the message).
    """
    cxx, et = _compiler(), _executorch_dir()
    cache = Path(os.environ.get("TOOLCHAIN_KERNEL_CACHE") or Path.home() / ".cache" / "toolchain" / "kernels")
    target = cache / _key(cxx) / _LIB_NAME
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=target.parent)
    os.close(fd)
    cmd = [cxx, *compile_flags(), f"-I{et}/include", f"-I{et}/include/executorch/runtime/core/portable_type/c10",
           str(KERNEL_SOURCE), "-o", tmp, f"-L{et}/lib", "-lexecutorch", f"-Wl,-rpath,{et}/lib"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            tail = "\n".join(done.stderr.strip().splitlines()[:5])
            raise KernelUnavailable(f"building {KERNEL_SOURCE.name} failed ({cxx}):\n{tail}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


_LOADED: ctypes.CDLL | None = None


def load_kernels() -> ctypes.CDLL:
    """Load (building if needed) the kernel library into this process, once; its ExecuTorch kernels are
    registered from then on. Returns the library (its C entry points, for the kernel tests)."""
    global _LOADED
    if _LOADED is None:
        path = kernel_library()
        try:
            lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            raise KernelUnavailable(f"cannot load {path} ({e})") from None
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        lib.toolchain_int4_linear_a8.argtypes = [ptr, i64, i64, ptr, ptr, i64, i64, i64, ptr]
        lib.toolchain_int4_linear_a8.restype = ctypes.c_int
        lib.toolchain_attention_decode.argtypes = [ptr, ptr, ptr, ptr, ptr, i64, i64, i64, i64, i64, i64,
                                                   ctypes.c_float, ptr]
        lib.toolchain_attention_decode.restype = ctypes.c_int
        f32 = ctypes.c_float
        signatures = {
            "toolchain_rms_norm": [ptr, i64, i64, ptr, f32, ptr],
            "toolchain_lora_linear_a8": [ptr, i64, i64, ptr, ptr, i64, i64, i64, ptr, ptr, ptr, i64, f32, ptr, ptr],
            "toolchain_rope_heads": [ptr, i64, i64, i64, i64, f32, ptr],
            "toolchain_swiglu": [ptr, ptr, i64, ptr],
        }
        for name, argtypes in signatures.items():
            getattr(lib, name).argtypes = argtypes
            getattr(lib, name).restype = ctypes.c_int
        _LOADED = lib
    return _LOADED
