#import "TCSharedArenaModule.h"

#include <memory>
#include <string>
#include <vector>

#include "SharedArenaCore.hpp"

using executorch::runtime::Error;

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
  std::unique_ptr<tc::SharedArenaCore> _core;
}

- (nullable instancetype)initWithPath:(NSString *)path error:(NSError **)error {
  self = [super init];
  if (self) {
    _core = std::make_unique<tc::SharedArenaCore>(std::string(path.UTF8String));
    const Error status = _core->load();
    if (status != Error::Ok) {
      TCFail(error, [NSString stringWithFormat:@"cannot load %@", path], status);
      return nil;
    }
  }
  return self;
}

- (BOOL)loadMethod:(NSString *)name error:(NSError **)error {
  const Error status = _core->load_method(std::string(name.UTF8String));
  return status == Error::Ok ? YES : TCFail(error, [NSString stringWithFormat:@"cannot load method %@", name], status);
}

- (nullable NSNumber *)trainStep:(NSString *)method
                        inputIds:(NSData *)inputIds
                          labels:(NSData *)labels
                              lr:(float)lr
                           error:(NSError **)error {
  if (inputIds.length != labels.length || inputIds.length % sizeof(int64_t) != 0) {
    TCFail(error, @"input_ids and labels must be int64 arrays of one length", Error::InvalidArgument);
    return nil;
  }
  float loss = 0;
  const Error status = _core->train_step(std::string(method.UTF8String),
                                         static_cast<const int64_t *>(inputIds.bytes),
                                         static_cast<const int64_t *>(labels.bytes),
                                         inputIds.length / sizeof(int64_t), lr, &loss);
  if (status != Error::Ok) {
    TCFail(error, [NSString stringWithFormat:@"%@ failed", method], status);
    return nil;
  }
  return @(loss);
}

- (nullable NSData *)getState:(NSError **)error {
  std::vector<float> state;
  const Error status = _core->get_state(&state);
  if (status != Error::Ok) {
    TCFail(error, @"get_state failed", status);
    return nil;
  }
  return [NSData dataWithBytes:state.data() length:state.size() * sizeof(float)];
}

- (BOOL)setState:(NSData *)state error:(NSError **)error {
  const Error status = _core->set_state(static_cast<const float *>(state.bytes), state.length / sizeof(float));
  return status == Error::Ok ? YES : TCFail(error, @"set_state failed", status);
}

@end
