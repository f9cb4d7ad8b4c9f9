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

#ifdef __cplusplus
}
#endif

#endif  // TOOLCHAIN_KERNELS_H
