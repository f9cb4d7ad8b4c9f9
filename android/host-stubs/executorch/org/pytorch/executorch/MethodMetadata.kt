package org.pytorch.executorch

/** Compile-only stand-in of org.pytorch.executorch.MethodMetadata (executorch-android 1.5.x, MethodMetadata.kt). */
class MethodMetadata internal constructor(val name: String, val backends: Array<String>)
