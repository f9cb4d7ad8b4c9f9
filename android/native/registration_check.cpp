// Host check of how the app links the generation kernel (android/native/CMakeLists.txt, run by
// android/test.sh): are `toolchain::int4_linear_a8.out` and the other fused-method kernels in the ExecuTorch
// kernel registry of this process, and does the registered W4A8 kernel compute? `registration_check_whole` links libtoolchain_kernels.a with
// --whole-archive as ExecuTorch's JNI library does (EXECUTORCH_JNI_CUSTOM_LIBRARY) and must find and run
// it (argument "present"); `registration_check_plain` links it plainly and must not find it ("absent"):
// nothing references the registration object, so the linker drops it.
#include <cstdio>
#include <cstring>

#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/portable_type/tensor_impl.h>
#include <executorch/runtime/kernel/kernel_runtime_context.h>
#include <executorch/runtime/kernel/operator_registry.h>

using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::runtime::EValue;
using executorch::runtime::KernelRuntimeContext;
using executorch::runtime::etensor::TensorImpl;

#ifdef TOOLCHAIN_KERNELS_JNI
// kernel_path_jni.cpp (the app's kernel path query), linked in with the kernels: nullptr (kernels without
// toolchain_kernel_path()) or one of the path names.
extern "C" const char* toolchain_kernel_path_for_app();
static bool kernel_path_ok() {
  const char* p = toolchain_kernel_path_for_app();
  std::printf("kernel path for the app: %s\n", p ? p : "none (kernels without toolchain_kernel_path)");
  if (p == nullptr) return true;
  for (const char* name : {"generic", "avx2", "avx_vnni", "avx512_vnni", "neon", "dotprod", "i8mm"})
    if (std::strcmp(p, name) == 0) return true;
  return false;
}
#else
static bool kernel_path_ok() { return true; }
#endif

int main(int argc, char** argv) {
  // every kernel a fused method lists (manifest generate.fused.kernels), then the ones only an int8 program's
  // training methods list (their kernels, program/spec.py INT8_KERNELS); the first is also run below
  const char* ops[] = {"toolchain::int4_linear_a8.out", "toolchain::attention_decode.out", "toolchain::rms_norm.out",
                       "toolchain::lora_linear_a8.out", "toolchain::rope_heads.out", "toolchain::swiglu.out",
                       "toolchain::int4_dyw_a8.out", "toolchain::attention_train.out",
                       "toolchain::attention_train_backward.out", "toolchain::swiglu_train.out",
                       "toolchain::online_softmax_stats.out", "toolchain::exp_sub_rows.out",
                       "toolchain::lora_backward.out", "toolchain::lora_rows_backward.out",
                       "toolchain::int4_dyw_a8_acc.out", "toolchain::lora_linear_a8_rows.out",
                       "toolchain::rope_train.out", "toolchain::rope_train_backward.out",
                       "toolchain::rms_norm_backward.out"};
  const char* op = ops[0];
  const bool want = argc > 1 && std::strcmp(argv[1], "present") == 0;
  bool has = true;
  for (const char* name : ops) {
    const bool here = executorch::runtime::registry_has_op_function(name);
    std::printf("%s: %s\n", name, here ? "registered" : "not registered");
    if (here != want) return 1;
    has = has && here;
  }
  if (!has) return 0;
  if (!kernel_path_ok()) return 1;
  // y = x W^T for x [1, 4], W [2, 4] int4 (group 4): high nibble = column 2j, value n - 8. x is on its int8
  // grid (max |x| = 127: the activation scale is 1), so the W4A8 result is exact.
  float x[4] = {127, -64, 32, 1};
  unsigned char q[4] = {(9 << 4) | 10, (7 << 4) | 8, (8 << 4) | 8, (12 << 4) | 4};  // W = [[1, 2, -1, 0], [0, 0, 4, -4]]
  float scales[2] = {0.5f, 2.0f};
  float y[2] = {0, 0};
  TensorImpl::SizesType xs[2] = {1, 4}, qs[2] = {2, 2}, ss[2] = {2, 1}, ys[2] = {1, 2};
  TensorImpl::DimOrderType order[2] = {0, 1};
  TensorImpl::StridesType xst[2] = {4, 1}, qst[2] = {2, 1}, sst[2] = {1, 1}, yst[2] = {2, 1};
  TensorImpl xi(ScalarType::Float, 2, xs, x, order, xst), qi(ScalarType::Byte, 2, qs, q, order, qst),
      si(ScalarType::Float, 2, ss, scales, order, sst), yi(ScalarType::Float, 2, ys, y, order, yst);
  EValue args[5] = {EValue(Tensor(&xi)), EValue(Tensor(&qi)), EValue(Tensor(&si)), EValue(int64_t(4)), EValue(Tensor(&yi))};
  EValue* stack[5] = {&args[0], &args[1], &args[2], &args[3], &args[4]};
  auto fn = executorch::runtime::get_op_function_from_registry(op);
  if (!fn.ok()) return 1;
  KernelRuntimeContext ctx;
  (*fn)(ctx, {stack, 5});
  std::printf("y = [%g, %g] (want [-16.5, 248])\n", y[0], y[1]);
  return ctx.failure_state() == executorch::runtime::Error::Ok && y[0] == -16.5f && y[1] == 248.0f ? 0 : 1;
}
