"""Build and load the native kernel library for this host (g++ against the executorch wheel).

The library is compiled once per (source and its kernels*.h headers, flags, compiler, executorch version)
into a cache directory ($TOOLCHAIN_KERNEL_CACHE, default ~/.cache/toolchain/kernels/<key>/), written
atomically (a temp file, then rename), and loaded with RTLD_GLOBAL: its static initializers register the
`toolchain::<op>.out` kernels with the ExecuTorch runtime the Python bindings share (as
`libexecutorch_kernels_quantized.so` registers its kernels). Which kernels and C entry points the library has
is the table in toolchain/mesp/kernels.py (above this torch-free layer: it passes the entry points' ctypes
signatures to `load_kernels`). `-march=native` is for the element-wise code; the int4 kernels' x86 paths
(kernels_x86.h: avx2, avx_vnni, avx512_vnni) are each compiled for their own instruction set and chosen at load
by the CPU (or $TOOLCHAIN_KERNEL_PATH=<name>, for testing: a path this CPU lacks raises KernelUnavailable naming
it); on arm64 the same holds for the neon, dotprod and i8mm paths (kernels_arm64.h). The summation order is the
source's (16 lanes), not the width's, so every path gives the same bits.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from toolchain.errors import ToolchainError

__all__ = ["KERNEL_SOURCE", "KernelUnavailable", "kernel_library", "kernel_path", "load_kernels", "compile_flags"]

KERNEL_SOURCE = Path(__file__).with_name("kernels.cpp")
KERNEL_HEADERS = tuple(sorted(KERNEL_SOURCE.parent.glob("kernels*.h")))  # included by kernels.cpp
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


def _pool_flags(et: Path) -> list[str]:
    """The kernels split rows over ExecuTorch's thread pool where the wheel ships it (libexecutorch_threadpool)."""
    return ["-DTOOLCHAIN_THREADPOOL", "-lexecutorch_threadpool"] if (et / "lib" / "libexecutorch_threadpool.so").is_file() else []


def _key(cxx: str, extra: tuple[str, ...] = ()) -> str:
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise KernelUnavailable(f"the C++ compiler {cxx} does not run ({e})") from None
    import importlib.metadata

    h = hashlib.sha256()
    for part in (KERNEL_SOURCE.read_bytes(), *(p.read_bytes() for p in KERNEL_HEADERS),
                 " ".join([*compile_flags(), *extra]).encode(), version.encode(),
                 importlib.metadata.version("executorch").encode(), _cpu_flags().encode()):
        h.update(part)
        h.update(b"\0")
    return h.hexdigest()[:16]


def _cpu_flags() -> str:
    """This CPU's feature flags (-march=native builds differ per CPU; a cache shared by machines must not mix)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def kernel_library() -> Path:
    """The built library for this host (built now if the cache lacks it).

    Raises:
        KernelUnavailable: no compiler, or the build failed (its first error lines in the message).
    """
    cxx, et = _compiler(), _executorch_dir()
    cache = Path(os.environ.get("TOOLCHAIN_KERNEL_CACHE") or Path.home() / ".cache" / "toolchain" / "kernels")
    pool = _pool_flags(et)
    target = cache / _key(cxx, tuple(pool)) / _LIB_NAME
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=target.parent)
    os.close(fd)
    cmd = [cxx, *compile_flags(), f"-I{et}/include", f"-I{et}/include/executorch/runtime/core/portable_type/c10",
           *pool[:1], str(KERNEL_SOURCE), "-o", tmp, f"-L{et}/lib", "-lexecutorch", *pool[1:], f"-Wl,-rpath,{et}/lib"]
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
Signatures = Mapping[str, tuple[type, Sequence[type]]]   # C entry point -> (restype, argtypes)


def load_kernels(signatures: Signatures | None = None) -> ctypes.CDLL:
    """Load (building if needed) the kernel library into this process, once; its ExecuTorch kernels are
    registered from then on. Returns the library; `signatures` (toolchain/mesp/kernels.py `c_signatures`) set
    its C entry points' ctypes types, for callers of those functions (the kernel tests).

    Raises:
        KernelUnavailable: it cannot be built or loaded, or lacks an entry point of `signatures`.
    """
    global _LOADED
    if _LOADED is None:
        path = kernel_library()
        try:
            _LOADED = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            raise KernelUnavailable(f"cannot load {path} ({e})") from None
        # The library's own protocol, whatever the caller's signatures: a forced path this CPU lacks.
        _LOADED.toolchain_kernel_path_error.argtypes = []
        _LOADED.toolchain_kernel_path_error.restype = ctypes.c_char_p
        error = _LOADED.toolchain_kernel_path_error()
        if error:   # $TOOLCHAIN_KERNEL_PATH forced a path this CPU lacks (or an unknown name): never a fallback
            _LOADED = None
            raise KernelUnavailable(f"$TOOLCHAIN_KERNEL_PATH: {error.decode()}")
    for name, (restype, argtypes) in (signatures or {}).items():
        try:
            fn = getattr(_LOADED, name)
        except AttributeError:
            raise KernelUnavailable(f"the kernel library has no entry point {name}; rebuild it") from None
        fn.restype, fn.argtypes = restype, list(argtypes)
    return _LOADED


def kernel_path() -> str:
    """The kernel path the loaded library runs (generic, avx2, avx_vnni, avx512_vnni, neon, dotprod, i8mm)."""
    fn = load_kernels().toolchain_kernel_path
    fn.argtypes, fn.restype = [], ctypes.c_char_p
    return fn().decode()
