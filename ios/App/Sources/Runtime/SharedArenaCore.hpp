// The C++ half of TCSharedArenaModule: ExecuTorch's extension `Module` with shared memory arenas,
// driven the way the manifest says. Header-only and free of Objective-C, so the same code is built
// into the app (through TCSharedArenaModule.mm) and, on Linux, into ios/hostcheck against the
// executorch 1.5.1 wheel's libexecutorch.so (see docs/ios.md).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>

// Only ios/hostcheck builds it as false, to show what the stock Swift `Module` does.
#ifndef TC_SHARE_MEMORY_ARENAS
#define TC_SHARE_MEMORY_ARENAS true
#endif

namespace tc {

using executorch::runtime::Error;

class SharedArenaCore {
 public:
  // Memory-mapped program; share_memory_arenas = true so every method sees one set of mutable
  // buffers (the program was exported with share_mutable_buffers=True). The Swift `Module` of the
  // ExecuTorch package passes false, which gives each method its own copy of the LoRA state.
  explicit SharedArenaCore(const std::string& path)
      : module_(std::make_unique<executorch::extension::Module>(
            path, executorch::extension::Module::LoadMode::Mmap,
            /*event_tracer=*/nullptr, /*memory_allocator=*/nullptr, /*temp_allocator=*/nullptr,
            /*share_memory_arenas=*/TC_SHARE_MEMORY_ARENAS)) {}

  Error load() { return module_->load(); }

  // Loading a method re-initializes the shared mutable state: load every method before training.
  Error load_method(const std::string& name) { return module_->load_method(name); }

  // train_step: (int64[T], int64[T], float32[1]) -> float32[1] loss.
  Error train_step(const std::string& method, const int64_t* ids, const int64_t* labels, size_t count,
                   float lr, float* loss) {
    using executorch::extension::make_tensor_ptr;
    const auto n = static_cast<executorch::aten::SizesType>(count);
    auto ids_t = make_tensor_ptr({n}, std::vector<int64_t>(ids, ids + count));
    auto labels_t = make_tensor_ptr({n}, std::vector<int64_t>(labels, labels + count));
    auto lr_t = make_tensor_ptr({1}, std::vector<float>{lr});
    const auto result = module_->execute(
        method, std::vector<executorch::runtime::EValue>{*ids_t, *labels_t, *lr_t});
    if (!result.ok()) return result.error();
    const auto& outputs = result.get();
    if (outputs.empty() || !outputs[0].isTensor()) return Error::InvalidProgram;
    *loss = outputs[0].toTensor().const_data_ptr<float>()[0];
    return Error::Ok;
  }

  // get_state: () -> float32[N], copied out (an output may alias the shared arena).
  Error get_state(std::vector<float>* state) {
    const auto result = module_->execute("get_state");
    if (!result.ok()) return result.error();
    const auto& outputs = result.get();
    if (outputs.empty() || !outputs[0].isTensor()) return Error::InvalidProgram;
    const auto& t = outputs[0].toTensor();
    state->assign(t.const_data_ptr<float>(), t.const_data_ptr<float>() + t.numel());
    return Error::Ok;
  }

  Error set_state(const float* values, size_t count) {
    auto t = executorch::extension::make_tensor_ptr(
        {static_cast<executorch::aten::SizesType>(count)}, std::vector<float>(values, values + count));
    const auto result = module_->execute("set_state", std::vector<executorch::runtime::EValue>{*t});
    return result.ok() ? Error::Ok : result.error();
  }

 private:
  std::unique_ptr<executorch::extension::Module> module_;
};

}  // namespace tc
