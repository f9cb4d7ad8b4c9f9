// Runs the app's ExecuTorch core (ios/App/Sources/Runtime/SharedArenaCore.hpp) on Linux against the
// executorch wheel's libexecutorch.so: the same C++ Module calls the iPhone makes. Driven by
// check.py, which writes the plan and compares the result with the host runner.
//
//   shared_arena_check MODEL.pte PLAN.txt STATE_OUT.bin
// PLAN.txt: "methods N name...", "numel N", then one line per step: "method lr T ids... labels...".
// Prints "shared_state ok|broken", "loss STEP VALUE" per step; writes the final state (float32).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "../App/Sources/Runtime/SharedArenaCore.hpp"

using executorch::runtime::Error;

static int fail(const std::string& what, Error e) {
  std::cerr << what << " (ExecuTorch error 0x" << std::hex << static_cast<unsigned>(e) << ")\n";
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: shared_arena_check MODEL.pte PLAN.txt STATE_OUT.bin\n";
    return 2;
  }
  std::ifstream plan(argv[2]);
  std::string word;
  size_t n_methods = 0, numel = 0;
  plan >> word >> n_methods;
  std::vector<std::string> methods(n_methods);
  for (auto& m : methods) plan >> m;
  plan >> word >> numel;

  tc::SharedArenaCore core(argv[1]);
  if (auto e = core.load(); e != Error::Ok) return fail("load", e);
  for (const auto& m : methods) {
    if (auto e = core.load_method(m); e != Error::Ok) return fail("load_method " + m, e);
  }
  // The check TrainerCore's verifySharedState makes: set a marked state, read it back, restore.
  std::vector<float> original, read_back;
  if (auto e = core.get_state(&original); e != Error::Ok) return fail("get_state", e);
  if (original.size() != numel) return fail("get_state size", Error::InvalidProgram);
  auto marked = original;
  marked[0] = 1234.5f;
  if (auto e = core.set_state(marked.data(), marked.size()); e != Error::Ok) return fail("set_state", e);
  if (auto e = core.get_state(&read_back); e != Error::Ok) return fail("get_state", e);
  std::cout << "shared_state " << (read_back == marked ? "ok" : "broken") << "\n";
  if (auto e = core.set_state(original.data(), original.size()); e != Error::Ok) return fail("set_state", e);

  std::string method;
  float lr;
  size_t t;
  for (int step = 0; plan >> method >> lr >> t; ++step) {
    std::vector<int64_t> ids(t), labels(t);
    for (auto& x : ids) plan >> x;
    for (auto& x : labels) plan >> x;
    float loss = 0;
    if (auto e = core.train_step(method, ids.data(), labels.data(), t, lr, &loss); e != Error::Ok) {
      return fail(method, e);
    }
    std::printf("loss %d %.9g\n", step, loss);
  }
  std::vector<float> state;
  if (auto e = core.get_state(&state); e != Error::Ok) return fail("get_state", e);
  std::ofstream(argv[3], std::ios::binary).write(reinterpret_cast<const char*>(state.data()),
                                                 static_cast<std::streamsize>(state.size() * sizeof(float)));
  return 0;
}
