// The iOS app's ExecuTorch path, in C++ on Linux against the executorch wheel's
// libexecutorch.so: the stock extension `Module`, constructed as the Swift
// `Module(filePath:loadMode: .mmap)` builds it (ExecuTorchModule.mm: Module(path, data_files = {},
// LoadMode::Mmap), so one memory arena per loaded method, as on the phone), every method loaded up
// front, and each call made as its `execute(_:_:)` makes it: `set_input` per index, then
// `execute(method)`. Inputs are wrapped without copying (`from_blob`, what `Tensor(bytesNoCopy:)`
// does): the weights file's bytes, the state's slices, the loop's activations, as TrainerCore's
// LayerLoop hands them over. check.py drives the layer loop (toolchain/runtime/loop.py) with this
// process as the runtime and compares with the Python bindings' runtime and the recorded trace.
//
//   module_check MODEL.pte METHOD...
//   module_check --probe KERNEL        prints "registered" or "missing": the app's kernel probe
//                                      (ios/App/Sources/Kernels/ToolchainKernels.cpp, linked in) asked
//                                      about KERNEL (check.py builds this binary with and without
//                                      toolchain/native/kernels.cpp, and loads the fused generation
//                                      methods only in the binary that registers their kernel)
// Then, on stdin, any number of requests; each answered on stdout:
//   request:  u32 name_len, name, u32 n_inputs, n_inputs x tensor
//   response: u32 status (0 ok, else the ExecuTorch error), u32 n_outputs, n_outputs x tensor
//   tensor:   u8 dtype (0 float32, 1 int64, 2 uint8, 3 int8), u32 ndim, ndim x i32 sizes, u64 nbytes, bytes
// All little-endian.
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>

#include "ToolchainKernels.h"

using executorch::aten::ScalarType;
using executorch::aten::SizesType;
using executorch::extension::from_blob;
using executorch::extension::Module;
using executorch::extension::TensorPtr;
using executorch::runtime::EValue;
using executorch::runtime::Error;

static bool read_all(void* p, size_t n) { return n == 0 || std::fread(p, 1, n, stdin) == n; }
static void write_all(const void* p, size_t n) { if (n) std::fwrite(p, 1, n, stdout); }
template <typename T> static bool rd(T& v) { return read_all(&v, sizeof v); }
template <typename T> static void wr(const T& v) { write_all(&v, sizeof v); }

static ScalarType scalar(uint8_t code) {
  switch (code) {
    case 0: return ScalarType::Float;
    case 1: return ScalarType::Long;
    case 2: return ScalarType::Byte;
    default: return ScalarType::Char;
  }
}

static uint8_t code(ScalarType t) {
  switch (t) {
    case ScalarType::Float: return 0;
    case ScalarType::Long: return 1;
    case ScalarType::Byte: return 2;
    default: return 3;
  }
}

static void answer_error(Error e) {
  wr(static_cast<uint32_t>(e) == 0 ? uint32_t(1) : static_cast<uint32_t>(e));
  wr(uint32_t(0));
  std::fflush(stdout);
}

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--probe") {
    std::cout << (toolchain_kernel_registered(argv[2]) ? "registered" : "missing") << std::endl;
    return 0;
  }
  if (argc == 2 && std::string(argv[1]) == "--kernel-path") {  // the app's kernel path query (ToolchainKernels.h)
    const char* p = toolchain_kernel_path_name();
    std::cout << (p ? p : "none") << std::endl;
    return 0;
  }
  if (argc < 3) {
    std::cerr << "usage: module_check MODEL.pte METHOD... | module_check --probe KERNEL\n";
    return 2;
  }
  Module module(argv[1], std::vector<std::string>{}, Module::LoadMode::Mmap);
  if (auto e = module.load(); e != Error::Ok) {
    std::cerr << "load failed: 0x" << std::hex << static_cast<unsigned>(e) << "\n";
    return 1;
  }
  for (int i = 2; i < argc; ++i) {
    if (auto e = module.load_method(argv[i]); e != Error::Ok) {
      std::cerr << "load_method " << argv[i] << " failed: 0x" << std::hex << static_cast<unsigned>(e) << "\n";
      return 1;
    }
  }
  for (;;) {
    uint32_t len = 0;
    if (!rd(len)) return 0;  // end of requests
    std::string method(len, '\0');
    uint32_t n = 0;
    if (!read_all(method.data(), len) || !rd(n)) return 1;
    std::vector<std::vector<uint8_t>> storage(n);
    std::vector<TensorPtr> inputs;
    for (uint32_t i = 0; i < n; ++i) {
      uint8_t dtype = 0;
      uint32_t ndim = 0;
      uint64_t nbytes = 0;
      if (!rd(dtype) || !rd(ndim)) return 1;
      std::vector<SizesType> sizes(ndim);
      for (auto& s : sizes) {
        int32_t v = 0;
        if (!rd(v)) return 1;
        s = static_cast<SizesType>(v);
      }
      if (!rd(nbytes)) return 1;
      storage[i].resize(nbytes);
      if (!read_all(storage[i].data(), nbytes)) return 1;
      inputs.push_back(from_blob(storage[i].data(), sizes, scalar(dtype)));
    }
    Error err = Error::Ok;
    for (size_t i = 0; i < inputs.size() && err == Error::Ok; ++i) err = module.set_input(method, EValue(*inputs[i]), i);
    if (err != Error::Ok) { answer_error(err); continue; }
    const auto result = module.execute(method);
    if (!result.ok()) { answer_error(result.error()); continue; }
    const auto& outs = result.get();
    wr(uint32_t(0));
    wr(static_cast<uint32_t>(outs.size()));
    for (const auto& v : outs) {
      const auto& t = v.toTensor();
      wr(code(t.scalar_type()));
      wr(static_cast<uint32_t>(t.dim()));
      for (auto s : t.sizes()) wr(static_cast<int32_t>(s));
      wr(static_cast<uint64_t>(t.nbytes()));
      write_all(t.const_data_ptr(), t.nbytes());
    }
    std::fflush(stdout);
  }
}
