#import "TCSharedArenaModule.h"

#include <memory>
#include <string>
#include <vector>

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>

using executorch::extension::Module;
using executorch::extension::make_tensor_ptr;
using executorch::runtime::Error;
using executorch::runtime::EValue;

static NSString *const TCErrorDomain = @"org.onphonellm.trainer.executorch";

static BOOL TCFail(NSError **error, NSString *what, Error code) {
  if (error) {
    *error = [NSError errorWithDomain:TCErrorDomain
                                 code:(NSInteger)code
                             userInfo:@{NSLocalizedDescriptionKey : [NSString stringWithFormat:@"%@ (ExecuTorch error 0x%x)", what, (unsigned)code]}];
  }
  return NO;
}

@implementation TCSharedArenaModule {
  std::unique_ptr<Module> _module;
}

- (nullable instancetype)initWithPath:(NSString *)path error:(NSError **)error {
  self = [super init];
  if (self) {
    _module = std::make_unique<Module>(std::string(path.UTF8String),
                                       Module::LoadMode::Mmap,
                                       /*event_tracer=*/nullptr,
                                       /*memory_allocator=*/nullptr,
                                       /*temp_allocator=*/nullptr,
                                       /*share_memory_arenas=*/true);
    const Error status = _module->load();
    if (status != Error::Ok) {
      TCFail(error, [NSString stringWithFormat:@"cannot load %@", path], status);
      return nil;
    }
  }
  return self;
}

- (BOOL)loadMethod:(NSString *)name error:(NSError **)error {
  const Error status = _module->load_method(std::string(name.UTF8String));
  if (status != Error::Ok) {
    return TCFail(error, [NSString stringWithFormat:@"cannot load method %@", name], status);
  }
  return YES;
}

- (nullable NSNumber *)trainStep:(NSString *)method
                        inputIds:(NSData *)inputIds
                          labels:(NSData *)labels
                              lr:(float)lr
                           error:(NSError **)error {
  const auto *ids = static_cast<const int64_t *>(inputIds.bytes);
  const auto *lab = static_cast<const int64_t *>(labels.bytes);
  const auto count = static_cast<executorch::aten::SizesType>(inputIds.length / sizeof(int64_t));
  auto idsTensor = make_tensor_ptr({count}, std::vector<int64_t>(ids, ids + count));
  auto labelsTensor = make_tensor_ptr({count}, std::vector<int64_t>(lab, lab + count));
  auto lrTensor = make_tensor_ptr({1}, std::vector<float>{lr});
  const auto result = _module->execute(std::string(method.UTF8String),
                                       std::vector<EValue>{EValue(*idsTensor), EValue(*labelsTensor), EValue(*lrTensor)});
  if (!result.ok()) {
    TCFail(error, [NSString stringWithFormat:@"%@ failed", method], result.error());
    return nil;
  }
  const auto &outputs = result.get();
  if (outputs.empty() || !outputs[0].isTensor()) {
    TCFail(error, [NSString stringWithFormat:@"%@ returned no loss tensor", method], Error::InvalidProgram);
    return nil;
  }
  return @(outputs[0].toTensor().const_data_ptr<float>()[0]);
}

- (nullable NSData *)getState:(NSError **)error {
  const auto result = _module->execute("get_state");
  if (!result.ok()) {
    TCFail(error, @"get_state failed", result.error());
    return nil;
  }
  const auto &outputs = result.get();
  if (outputs.empty() || !outputs[0].isTensor()) {
    TCFail(error, @"get_state returned no tensor", Error::InvalidProgram);
    return nil;
  }
  const auto &state = outputs[0].toTensor();
  return [NSData dataWithBytes:state.const_data_ptr<float>() length:state.numel() * sizeof(float)];
}

- (BOOL)setState:(NSData *)state error:(NSError **)error {
  const auto *values = static_cast<const float *>(state.bytes);
  const auto count = static_cast<executorch::aten::SizesType>(state.length / sizeof(float));
  auto tensor = make_tensor_ptr({count}, std::vector<float>(values, values + count));
  const auto result = _module->execute("set_state", std::vector<EValue>{EValue(*tensor)});
  if (!result.ok()) {
    return TCFail(error, @"set_state failed", result.error());
  }
  return YES;
}

@end
