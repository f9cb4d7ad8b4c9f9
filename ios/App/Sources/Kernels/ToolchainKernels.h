// What the Swift runtime asks about native ExecuTorch kernels (the app's bridging header includes this).
// ToolchainKernels.cpp answers from the ExecuTorch kernel registry of this process, which the kernels fill
// from their static initializers at load: toolchain/native/kernels.cpp (compiled into the app target,
// project.yml) registers `toolchain::int4_linear_a8.out`. ios/hostcheck builds the same file into its host
// binary with and without the kernel and checks both answers.
#ifndef TOOLCHAIN_KERNELS_H
#define TOOLCHAIN_KERNELS_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/// Whether the ExecuTorch runtime of this process has a kernel registered under `name`
/// (an operator name as the manifest lists it, e.g. "toolchain::int4_linear_a8.out").
bool toolchain_kernel_registered(const char *name);

/// The run-time path the native kernels chose for this CPU (toolchain_kernel_path() of toolchain/native/kernels.cpp:
/// "generic", "avx2", "avx_vnni", "avx512_vnni", "neon", "dotprod", "i8mm"), or NULL when the kernels predate that
/// function (ToolchainKernels.cpp's weak stand-in answers then) or it named no path.
const char *toolchain_kernel_path_name(void);

#ifdef __cplusplus
}
#endif

#endif  // TOOLCHAIN_KERNELS_H
