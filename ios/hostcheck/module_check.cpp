// The iOS app's ExecuTorch path, in C++ on Linux against the executorch wheel's libexecutorch.so:
// the stock extension `Module`, constructed as the Swift `Module(filePath:loadMode: .mmap)` builds
// it (ExecuTorchModule.mm: Module(path, data_files = {}, LoadMode::Mmap), so per-method memory
// arenas), and called as its `execute(_:_:)` calls it (set_input per index, then execute(method)).
// The state is driven as TrainerCore.Trainer drives it (manifest schema_version 2): inputs = ids,
// labels, lr, every state entry's slice (copied into a tensor, as `Tensor<Float>(bytes:shape:)`
// does); each output after the loss copied into its entry's slice by name. check.py writes the
// plan and compares the result with the host runner.
//
//   module_check MODEL.pte PLAN.txt STATE_IN.bin STATE_OUT.bin
// PLAN.txt: "entries N", N x "name offset ndim dims...", "methods M", M x "name n_out out_names...",
//           then one line per step: "method lr T ids... labels...".
// Prints "loss STEP VALUE" per step; writes the final state (raw float32).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>

using executorch::aten::SizesType;
using executorch::extension::make_tensor_ptr;
using executorch::extension::Module;
using executorch::extension::TensorPtr;
using executorch::runtime::EValue;
using executorch::runtime::Error;

struct Entry {
  size_t offset = 0, numel = 1;
  std::vector<SizesType> shape;
};

static int fail(const std::string& what, Error e) {
  std::cerr << what << " (ExecuTorch error 0x" << std::hex << static_cast<unsigned>(e) << ")\n";
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: module_check MODEL.pte PLAN.txt STATE_IN.bin STATE_OUT.bin\n";
    return 2;
  }
  std::ifstream plan(argv[2]);
  std::string word;
  size_t n = 0;
  plan >> word >> n;
  std::vector<std::string> order(n);
  std::map<std::string, Entry> entries;
  size_t numel = 0;
  for (auto& name : order) {
    Entry e;
    size_t ndim = 0;
    plan >> name >> e.offset >> ndim;
    e.shape.resize(ndim);
    for (auto& d : e.shape) {
      plan >> d;
      e.numel *= static_cast<size_t>(d);
    }
    numel = std::max(numel, e.offset + e.numel);
    entries[name] = e;
  }
  plan >> word >> n;
  std::map<std::string, std::vector<std::string>> outputs;
  for (size_t i = 0; i < n; ++i) {
    std::string method;
    size_t k = 0;
    plan >> method >> k;
    outputs[method].resize(k);
    for (auto& o : outputs[method]) plan >> o;
  }
  std::vector<float> state(numel);
  std::ifstream(argv[3], std::ios::binary).read(reinterpret_cast<char*>(state.data()),
                                                 static_cast<std::streamsize>(numel * sizeof(float)));

  Module module(argv[1], std::vector<std::string>{}, Module::LoadMode::Mmap);
  if (auto e = module.load(); e != Error::Ok) return fail("load", e);
  for (const auto& [method, _] : outputs) {
    if (auto e = module.load_method(method); e != Error::Ok) return fail("load_method " + method, e);
  }

  std::string method;
  float lr;
  size_t t;
  for (int step = 0; plan >> method >> lr >> t; ++step) {
    std::vector<int64_t> ids(t), labels(t);
    for (auto& x : ids) plan >> x;
    for (auto& x : labels) plan >> x;
    std::vector<TensorPtr> inputs;
    inputs.push_back(make_tensor_ptr({static_cast<SizesType>(t)}, ids));
    inputs.push_back(make_tensor_ptr({static_cast<SizesType>(t)}, labels));
    inputs.push_back(make_tensor_ptr({1}, std::vector<float>{lr}));
    for (const auto& name : order) {
      const auto& e = entries[name];
      inputs.push_back(make_tensor_ptr(e.shape, std::vector<float>(state.begin() + e.offset,
                                                                   state.begin() + e.offset + e.numel)));
    }
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (auto e = module.set_input(method, EValue(*inputs[i]), i); e != Error::Ok) return fail("set_input", e);
    }
    const auto result = module.execute(method);
    if (!result.ok()) return fail(method, result.error());
    const auto& outs = result.get();
    const auto& names = outputs[method];
    if (outs.size() != names.size() + 1) return fail(method + ": output count", Error::InvalidProgram);
    std::printf("loss %d %.9g\n", step, outs[0].toTensor().const_data_ptr<float>()[0]);
    for (size_t i = 0; i < names.size(); ++i) {
      const auto& e = entries.at(names[i]);
      const auto& out = outs[i + 1].toTensor();
      if (static_cast<size_t>(out.numel()) != e.numel) return fail(names[i] + ": size", Error::InvalidProgram);
      std::copy(out.const_data_ptr<float>(), out.const_data_ptr<float>() + e.numel, state.begin() + e.offset);
    }
  }
  std::ofstream(argv[4], std::ios::binary).write(reinterpret_cast<const char*>(state.data()),
                                                 static_cast<std::streamsize>(state.size() * sizeof(float)));
  return 0;
}
