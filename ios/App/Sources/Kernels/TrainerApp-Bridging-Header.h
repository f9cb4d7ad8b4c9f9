// The app target's Objective-C bridging header (project.yml SWIFT_OBJC_BRIDGING_HEADER): the C entry
// points of the app's own C++ (the native kernel probe) for Swift.
#include "ToolchainKernels.h"
