// See ToolchainKernels.h. Needs the ExecuTorch runtime headers of the linked runtime's version
// (project.yml's HEADER_SEARCH_PATHS; docs/ios.md, "The int4 generation kernel").
#include "ToolchainKernels.h"

#include <executorch/runtime/kernel/operator_registry.h>

extern "C" bool toolchain_kernel_registered(const char *name) {
  // No tensor meta: a kernel registered without a key (EXECUTORCH_LIBRARY's), the fallback for any dtype.
  return name != nullptr && ::executorch::ET_RUNTIME_NAMESPACE::registry_has_op_function(name);
}

// kernels.cpp's toolchain_kernel_path() exists only in kernels with the run-time path chooser: this weak definition
// stands in for it otherwise (the linker takes the kernels' strong one when the target has it), so an app built with
// older kernels, or without them, still links and says "path unknown".
extern "C" __attribute__((weak)) const char *toolchain_kernel_path() { return nullptr; }

extern "C" const char *toolchain_kernel_path_name(void) { return toolchain_kernel_path(); }
