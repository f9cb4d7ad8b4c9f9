// See ToolchainKernels.h. Needs the ExecuTorch runtime headers of the linked runtime's version
// (project.yml's HEADER_SEARCH_PATHS; docs/ios.md, "The int4 generation kernel").
#include "ToolchainKernels.h"

#include <executorch/runtime/kernel/operator_registry.h>

extern "C" bool toolchain_kernel_registered(const char *name) {
  // No tensor meta: a kernel registered without a key (EXECUTORCH_LIBRARY's), the fallback for any dtype.
  return name != nullptr && ::executorch::ET_RUNTIME_NAMESPACE::registry_has_op_function(name);
}
