// Objective-C(++) code the Swift sources use.
#import "TCSharedArenaModule.h"
