"""The program directory, reader and writer as a pair: what a program is (`ProgramSpec`, `method_specs`,
`state_layout`, `FUSED_KERNELS`: spec.py), its weights file (layout, writer, mapper: weights_file.py), its
manifest's writer (`build_manifest`: manifest.py) and its reader (`ProgramDir`: directory.py), over the
torch-free format of toolchain/contract. `export/` writes programs through it; `runtime/` runs them."""

from toolchain.program.directory import ProgramDir
from toolchain.program.spec import FUSED_KERNELS, ProgramSpec, QuantSpec, method_specs, state_layout

__all__ = ["ProgramDir", "ProgramSpec", "QuantSpec", "method_specs", "state_layout", "FUSED_KERNELS"]
