#import <Foundation/Foundation.h>

NS_ASSUME_NONNULL_BEGIN

/// ExecuTorch's C++ `Module` created with `share_memory_arenas = true`, for training programs whose
/// methods share their LoRA state (exported with `share_mutable_buffers=True`). The Swift `Module`
/// of the ExecuTorch package builds its C++ module without that flag, so there every method gets its
/// own copy of the mutable buffers and `get_state` never sees what `train_step` did.
///
/// Tensors cross as raw bytes: input ids and labels int64, lr and the state float32 (native,
/// little-endian on every iPhone). Not thread-safe: call from one queue.
NS_SWIFT_NAME(SharedArenaModule)
@interface TCSharedArenaModule : NSObject

/// Open the program memory-mapped (frozen weights stay clean pages, not counted in the footprint).
- (nullable instancetype)initWithPath:(NSString *)path error:(NSError **)error NS_DESIGNATED_INITIALIZER;
- (instancetype)init NS_UNAVAILABLE;

/// Load one method (re-initializes the shared mutable state: load every method before training).
- (BOOL)loadMethod:(NSString *)name error:(NSError **)error NS_SWIFT_NAME(load(method:));

/// train_step: (int64[T], int64[T], float32[1]) -> float32[1] loss.
- (nullable NSNumber *)trainStep:(NSString *)method
                        inputIds:(NSData *)inputIds
                          labels:(NSData *)labels
                              lr:(float)lr
                           error:(NSError **)error NS_SWIFT_NAME(trainStep(method:inputIds:labels:lr:));

/// get_state: () -> float32[N], copied out (outputs may alias the shared arena).
- (nullable NSData *)getState:(NSError **)error NS_SWIFT_NAME(getState());

/// set_state: (float32[N]) -> ...
- (BOOL)setState:(NSData *)state error:(NSError **)error NS_SWIFT_NAME(setState(_:));

@end

NS_ASSUME_NONNULL_END
