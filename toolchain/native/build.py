"""Build and load the native kernel library for this host (g++ against the executorch wheel).

The library is compiled once per (source, flags, compiler, executorch version) into a cache directory
($TOOLCHAIN_KERNEL_CACHE, default ~/.cache/toolchain/kernels/<key>/), written atomically (a temp file,
then rename), and loaded with RTLD_GLOBAL: its static initializers register the `toolchain::<op>.out` kernels
with the ExecuTorch runtime the Python bindings share (as `libexecutorch_kernels_quantized.so` registers
its kernels). Which kernels and C entry points the library has is the table in toolchain/mesp/kernels.py
(above this torch-free layer: it passes the entry points' ctypes signatures to `load_kernels`).
`-march=native` picks this host's vector width (AVX2 or AVX-512 here, NEON in the apps); the summation order
is the source's (16 lanes), not the width's.
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

__all__ = ["KERNEL_SOURCE", "KernelUnavailable", "kernel_library", "load_kernels", "compile_flags"]

KERNEL_SOURCE = Path(__file__).with_name("kernels.cpp")
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
    for part in (KERNEL_SOURCE.read_bytes(), " ".join(compile_flags()).encode(), version.encode(),
                 importlib.metadata.version("executorch").encode()):
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
    for name, (restype, argtypes) in (signatures or {}).items():
        try:
            fn = getattr(_LOADED, name)
        except AttributeError:
            raise KernelUnavailable(f"the kernel library has no entry point {name}; rebuild it") from None
        fn.restype, fn.argtypes = restype, list(argtypes)
    return _LOADED
