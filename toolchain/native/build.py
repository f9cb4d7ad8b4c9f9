"""Build and load the native kernel library for this host (g++ against the executorch wheel).

The library is compiled once per (source and its kernels*.h headers, flags, compiler, executorch version)
into a cache directory ($TOOLCHAIN_KERNEL_CACHE, default ~/.cache/toolchain/kernels/<key>/), written
atomically (a temp file, then rename) with the sha256 of the built file beside it (`<lib>.sha256`, also written
atomically, after the library). At load the file must be a regular file with that hash; otherwise (truncated,
another file, no record, a directory, FIFO or symbolic link at its path) it is rebuilt and put in place by an
atomic rename (a directory there is first moved aside and removed), only inside the cache directory (an entry
whose directory resolves elsewhere is refused, never touched or written into).
What still fails at load (a record damaged to match a damaged library, a library lacking an entry point, a
dlopen error) is one KernelUnavailable naming the cache path and how to clear it. The library is loaded with
RTLD_GLOBAL: its static initializers register the `toolchain::<op>.out` kernels with the ExecuTorch runtime
the Python bindings share (as `libexecutorch_kernels_quantized.so` registers its kernels). Which kernels and C
entry points the library has is the table in toolchain/mesp/kernels.py (above this torch-free layer: it passes
the entry points' ctypes signatures to `load_kernels`). `-march=native` is for the element-wise code; the int4
kernels' x86 paths (kernels_x86.h: avx2, avx_vnni, avx512_vnni) are each compiled for their own instruction
set and chosen at load by the CPU (or $TOOLCHAIN_KERNEL_PATH=<name>, for testing: a path this CPU lacks raises
KernelUnavailable naming it); on arm64 the same holds for the neon, dotprod and i8mm paths (kernels_arm64.h).
The summation order is the source's (16 lanes), not the width's, so every path gives the same bits.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from toolchain.errors import ToolchainError

__all__ = ["KERNEL_SOURCE", "KernelUnavailable", "kernel_cache", "kernel_library", "kernel_path", "load_kernels",
           "compile_flags"]

KERNEL_SOURCE = Path(__file__).with_name("kernels.cpp")
KERNEL_HEADERS = tuple(sorted(KERNEL_SOURCE.parent.glob("kernels*.h")))  # included by kernels.cpp
_LIB_NAME = "libtoolchain_kernels.so"


class KernelUnavailable(ToolchainError):
    """The native kernels cannot be built or loaded here (no C++ compiler, no executorch wheel)."""


def compile_flags() -> list[str]:
    return ["-std=c++17", "-O3", "-march=native", "-ffp-contract=fast", "-fPIC", "-shared",
            "-Wno-deprecated-declarations", "-DC10_USING_CUSTOM_GENERATED_MACROS",
            "-DET_EVENT_TRACER_ENABLED"]   # each toolchain op is an ETDump event of its own name (a null check without one)


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


def kernel_cache() -> Path:
    """The cache directory the toolchain owns ($TOOLCHAIN_KERNEL_CACHE, default ~/.cache/toolchain/kernels)."""
    return Path(os.environ.get("TOOLCHAIN_KERNEL_CACHE") or Path.home() / ".cache" / "toolchain" / "kernels")


def clear_hint(path: Path | None = None) -> str:
    """How to clear a damaged cache entry (the tail of every load error)."""
    where = path.parent if path is not None else kernel_cache()
    return f"clear it with `rm -r {where}` (or point $TOOLCHAIN_KERNEL_CACHE at another directory) and run again"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
    finally:
        os.close(fd)
    return h.hexdigest()


def _record(target: Path) -> Path:
    return target.with_name(target.name + ".sha256")


def _verified(target: Path) -> bool:
    """The cached library is a regular file whose sha256 is the one recorded when it was built."""
    try:
        if not stat.S_ISREG(os.lstat(target).st_mode) or not stat.S_ISREG(os.lstat(_record(target)).st_mode):
            return False
        recorded = _record(target).read_text(encoding="ascii").strip()
        return recorded == _sha256(target)
    except (OSError, ValueError):          # missing, unreadable, a loop, not ASCII: rebuilt
        return False


def _clear_entry(path: Path, cache: Path) -> None:
    """Make room for the rebuilt file at `path`, only when it lies inside the cache directory the toolchain owns
    (otherwise refuse: never touch a user's files). A directory is moved aside and removed; anything else (a
    stale file, a FIFO, a link or loop) is left for the atomic rename of the new file to replace, so a process
    that reads the entry meanwhile sees the old file or the new one, never no file."""
    if not os.path.lexists(path):
        return
    parent = os.path.realpath(path.parent)
    root = os.path.realpath(cache)
    if os.path.commonpath([parent, root]) != root:
        raise KernelUnavailable(f"the kernel cache entry {path} is not inside the cache directory {cache} (its "
                                f"directory resolves to {parent}); not touching it: {clear_hint(path)}")
    if not stat.S_ISDIR(os.lstat(path).st_mode):
        return
    aside = Path(parent) / f".stale-{os.getpid()}-{os.urandom(4).hex()}"
    try:
        os.rename(path, aside)             # the name is free at once; its content is removed below
        shutil.rmtree(aside)               # never follows a symbolic link inside it
    except OSError as e:
        raise KernelUnavailable(f"cannot clear the kernel cache entry {path} ({e.strerror or e}); "
                                f"{clear_hint(path)}") from None


def _write_atomic(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".rec-", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _compile(cmd: list[str], cxx: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[:5])
        raise KernelUnavailable(f"building {KERNEL_SOURCE.name} failed ({cxx}):\n{tail}")


def kernel_library() -> Path:
    """The built library for this host (built now if the cache lacks it, or rebuilt when the cached entry is
    not a regular file or not the file whose sha256 was recorded beside it, `<lib>.sha256`, at build time).

    Raises:
        KernelUnavailable: no compiler, the build failed (its first error lines in the message), or the entry
            cannot be cleared (outside the cache directory, not removable).
    """
    cxx, et = _compiler(), _executorch_dir()
    cache = kernel_cache()
    pool = _pool_flags(et)
    target = cache / _key(cxx, tuple(pool)) / _LIB_NAME
    if _verified(target):
        return target
    if os.path.lexists(target.parent) and not os.path.isdir(target.parent):
        try:                                   # a file, FIFO, dangling link or loop as the entry's directory
            os.unlink(target.parent)           # (in the cache directory itself; a link is removed, not followed)
        except OSError as e:
            raise KernelUnavailable(f"cannot clear the kernel cache entry {target.parent} ({e.strerror or e}); "
                                    f"{clear_hint(target)}") from None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise KernelUnavailable(f"cannot create the kernel cache directory {target.parent} ({e.strerror or e}); "
                                f"{clear_hint(target)}") from None
    inside, root = os.path.realpath(target.parent), os.path.realpath(cache)
    if os.path.commonpath([inside, root]) != root:   # a link to a user's directory: never written into
        raise KernelUnavailable(f"the kernel cache entry {target} is not inside the cache directory {cache} (its "
                                f"directory resolves to {inside}); not touching it: {clear_hint(target)}")
    for stale in (_record(target), target):    # a directory at either path is removed
        _clear_entry(stale, cache)
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=target.parent)
    os.close(fd)
    cmd = [cxx, *compile_flags(), f"-I{et}/include", f"-I{et}/include/executorch/runtime/core/portable_type/c10",
           *pool[:1], str(KERNEL_SOURCE), "-o", tmp, f"-L{et}/lib", "-lexecutorch", *pool[1:], f"-Wl,-rpath,{et}/lib"]
    try:
        _compile(cmd, cxx)
        digest = _sha256(Path(tmp))
        os.replace(tmp, target)               # the library, then its record: a crash between leaves no record
        _write_atomic(_record(target), (digest + "\n").encode())
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


_LOADED: ctypes.CDLL | None = None
_LOADED_PATH: Path | None = None
Signatures = Mapping[str, tuple[type, Sequence[type]]]   # C entry point -> (restype, argtypes)


def _check_pool_spin() -> None:
    """$TOOLCHAIN_POOL_SPIN_US, when set, is what kernels.cpp's workers accept (an integer 0 .. 100000: their spin in
    microseconds before sleeping, docs/kernels.md); the library would otherwise ignore it for its default."""
    value = os.environ.get("TOOLCHAIN_POOL_SPIN_US")
    if value is not None and not (value.strip().isdigit() and int(value) <= 100_000):
        raise KernelUnavailable(f"$TOOLCHAIN_POOL_SPIN_US: {value!r} is not an integer from 0 to 100000 "
                                f"(microseconds the kernels' workers spin before sleeping; unset: 200)")


def load_kernels(signatures: Signatures | None = None) -> ctypes.CDLL:
    """Load (building if needed) the kernel library into this process, once; its ExecuTorch kernels are
    registered from then on. Returns the library; `signatures` (toolchain/mesp/kernels.py `c_signatures`) set
    its C entry points' ctypes types, for callers of those functions (the kernel tests).

    Raises:
        KernelUnavailable: it cannot be built or loaded, or lacks an entry point of `signatures`.
    """
    global _LOADED, _LOADED_PATH
    if _LOADED is None:
        _check_pool_spin()
        path = kernel_library()
        try:
            lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        except OSError as e:
            raise KernelUnavailable(f"cannot load the kernel library {path} ({e}); {clear_hint(path)}") from None
        try:   # the library's own protocol, whatever the caller's signatures: a forced path this CPU lacks
            probe = lib.toolchain_kernel_path_error
        except AttributeError:
            raise KernelUnavailable(f"the kernel library {path} is not this toolchain's (no entry point "
                                    f"toolchain_kernel_path_error); {clear_hint(path)}") from None
        probe.argtypes, probe.restype = [], ctypes.c_char_p
        error = probe()
        if error:   # $TOOLCHAIN_KERNEL_PATH forced a path this CPU lacks (or an unknown name): never a fallback
            raise KernelUnavailable(f"$TOOLCHAIN_KERNEL_PATH: {error.decode()}")
        _LOADED, _LOADED_PATH = lib, path
    for name, (restype, argtypes) in (signatures or {}).items():
        try:
            fn = getattr(_LOADED, name)
        except AttributeError:
            raise KernelUnavailable(f"the kernel library {_LOADED_PATH} has no entry point {name}; "
                                    f"{clear_hint(_LOADED_PATH)}") from None
        fn.restype, fn.argtypes = restype, list(argtypes)
    return _LOADED


def kernel_path() -> str:
    """The kernel path the loaded library runs (generic, avx2, avx_vnni, avx512_vnni, neon, dotprod, i8mm)."""
    fn = load_kernels().toolchain_kernel_path
    fn.argtypes, fn.restype = [], ctypes.c_char_p
    return fn().decode()
