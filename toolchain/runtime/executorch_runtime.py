"""Host runtime for the ExecuTorch program: the same C++ runtime the apps link, through its Python
bindings. Inputs are passed as they are (the program does not plan them): weights are views of the
memory-mapped weights file, state inputs views of the app's state array; nothing is copied in.

The runtime's native log lines (its cpuinfo probe prints five when the thread pool starts) are written by
C++ straight to file descriptor 2: the pool is started here with fd 2 pointed at /dev/null (or at
$TOOLCHAIN_NATIVE_LOG), unless the runtime is opened with `verbose=True` (`toolchain --verbose`). A .pte is
checked for the flatbuffer identifier and sizes of an ExecuTorch program before the runtime sees it: the
bindings abort the process (SIGABRT) on some garbage instead of raising."""

from __future__ import annotations

import contextlib
import os
import struct
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

from toolchain.errors import BadInput

__all__ = ["ExecuTorchRuntime", "BoundMethod", "check_pte", "native_log_redirected", "load_quantized_kernels"]


def load_quantized_kernels() -> None:
    """Register ExecuTorch's quantized kernels (int4 methods call `quantized_decomposed::embedding_4bit`)
    with the runtime, as the apps link them (`kernels_quantized`). The library itself, not the
    `executorch.kernels.quantized` package: that one loads an AOT library which also changes the
    runtime's `aten::linear` results in the last bits, so the host would no longer compute what the
    app's C++ `Module` computes (ios/hostcheck checks they agree bit for bit)."""
    import ctypes

    import executorch

    global _QUANTIZED_KERNELS
    if _QUANTIZED_KERNELS is None:
        lib = Path(executorch.__path__[0]) / "lib" / "libexecutorch_kernels_quantized.so"
        _QUANTIZED_KERNELS = ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)


_QUANTIZED_KERNELS = None


class ExecuTorchRuntime:
    """`model.pte` with its methods loaded (each loaded once, then called by name)."""

    backend = "executorch"

    def __init__(self, pte: Path, method_names: list[str], *, threads: int | None = None,
                 verbose: bool = False) -> None:
        """threads: size of the runtime's thread pool (XNNPACK's threads); None keeps its default, one per
        core. The optimized (non-delegated) kernels run on one thread either way. verbose: the runtime's
        native log lines go to stderr (else to $TOOLCHAIN_NATIVE_LOG or nowhere: `native_log_redirected`)."""
        from executorch.extension.pybindings import portable_lib
        from executorch.runtime import Runtime

        self.verbose = verbose
        load_quantized_kernels()
        check_pte(Path(pte))
        with native_log_redirected(self.verbose):
            portable_lib._threadpool_get_thread_count()      # starts the pool: its cpuinfo lines go to the log
            if threads is not None:
                portable_lib._unsafe_reset_threadpool(threads)
        try:
            with native_log_redirected(self.verbose):       # a refusal's native detail lines go to the log too
                self.program = Runtime.get().load_program(Path(pte))
        except (RuntimeError, ValueError) as e:
            raise BadInput(f"{pte} cannot be loaded by the ExecuTorch runtime ({e}); re-export the program") from None
        missing = sorted(set(method_names) - set(self.program.method_names))
        if missing:
            raise BadInput(f"{pte} lacks method(s) {', '.join(missing)} listed in its manifest; re-export the program")
        try:
            with native_log_redirected(self.verbose):
                self.methods = {name: self.program.load_method(name) for name in method_names}
            self._slots: dict[tuple[str, object], _Slot] = {}   # (method, slot) -> its instance and live binding
        except (RuntimeError, ValueError) as e:
            raise BadInput(f"{pte}: a method cannot be loaded by the ExecuTorch runtime ({e}); re-export the "
                           f"program") from None

    def bind(self, method: str, slot: object, inputs: list[torch.Tensor]) -> BoundMethod:
        """`method`'s instance for `slot` (one per layer: its own loaded copy of the method) with `inputs` set
        once. The program does not plan its inputs, so the runtime keeps pointers to these tensors: a call is
        then `execute()` alone (no conversion of ~37 inputs per call, ~1 ms a token at Qwen2.5-0.5B), and the
        caller changes the inputs' contents in place between calls (never their storage). Binding a slot again
        (the next generation) retires the previous BoundMethod of that slot: executing it raises."""
        key = (method, slot)
        entry = self._slots.get(key)
        if entry is None:
            with native_log_redirected(self.verbose):
                entry = self._slots[key] = _Slot(self.program._program.load_method(method))
        entry.bound = BoundMethod(entry, inputs, key)
        return entry.bound

    def execute(self, method: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Outputs are views of the planned arena, valid until the next call of ANY method: the Python
        bindings' `Program` shares one arena between its methods (the phones' `Module` does not), and
        `clone_outputs=False` skips the bindings' own copy. Callers copy what they keep (LayerLoop does),
        as the apps copy a method's outputs out of its arena."""
        return list(self.methods[method]._method.call(inputs, clone_outputs=False))


class _Slot:
    """One (method, slot) of `ExecuTorchRuntime.bind`: its own loaded instance of the method and the binding
    whose inputs the instance holds now (None before the first `bind`)."""

    __slots__ = ("instance", "bound")

    def __init__(self, instance) -> None:
        self.instance, self.bound = instance, None


class BoundMethod:
    """A loaded method instance with its inputs set (`ExecuTorchRuntime.bind`). Holds the input tensors so
    they outlive the runtime's pointers to them. Outputs are views of the planned arena, as `execute`'s."""

    def __init__(self, slot: _Slot, inputs: list[torch.Tensor], key: tuple) -> None:
        self._slot, self.inputs, self._key = slot, list(inputs), key
        slot.instance.set_inputs(self.inputs)

    def execute(self) -> list[torch.Tensor]:
        if self._slot.bound is not self:   # the instance was bound again: its pointers are not ours
            raise RuntimeError(f"{self._key[0]} (slot {self._key[1]}) was bound again; this binding is retired")
        self._slot.instance.execute()
        return list(self._slot.instance.get_outputs(clone_outputs=False))


def check_pte(pte: Path) -> None:
    """The file starts like an ExecuTorch program: flatbuffer root offset, file identifier `ETnn`, and (when
    present) an extended header `eh00` whose program and segment sizes fit in the file.

    Raises:
        BadInput: it does not (naming what is wrong).
    """
    from toolchain.inputs import open_input

    try:
        with open_input(pte) as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(32)
    except OSError as e:
        raise BadInput(f"{pte} cannot be read ({e.strerror}); re-export the program") from None
    if len(head) < 8 or head[4:6] != b"ET" or not head[6:8].isdigit():
        raise BadInput(f"{pte} is not an ExecuTorch program (no ExecuTorch flatbuffer identifier at byte 4); "
                       f"re-export the program")
    root = struct.unpack_from("<I", head, 0)[0]
    if not 8 <= root < size:
        raise BadInput(f"{pte} is not a valid ExecuTorch program (flatbuffer root offset {root} outside the "
                       f"{size}-byte file); re-export the program")
    if len(head) >= 32 and head[8:12] == b"eh00":
        program_size, segment_base = struct.unpack_from("<QQ", head, 16)
        if program_size > size or segment_base > size:
            raise BadInput(f"{pte} is truncated or corrupt (its header declares {max(program_size, segment_base)} "
                           f"bytes, the file has {size}); re-export the program")


@contextlib.contextmanager
def native_log_redirected(verbose: bool = False) -> Iterator[None]:
    """Point file descriptor 2 at $TOOLCHAIN_NATIVE_LOG (appended) or /dev/null for the block, unless
    `verbose` (`toolchain --verbose`): native libraries write their log lines there directly."""
    if verbose:
        yield
        return
    target = os.environ.get("TOOLCHAIN_NATIVE_LOG") or os.devnull
    try:
        log = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError:
        log = os.open(os.devnull, os.O_WRONLY)
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(log, 2)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(log)
