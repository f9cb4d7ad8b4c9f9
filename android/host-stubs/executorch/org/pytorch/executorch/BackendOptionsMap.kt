package org.pytorch.executorch

import org.pytorch.executorch.annotations.Experimental

/** Compile-only stand-in of org.pytorch.executorch.BackendOption (executorch-android 1.5.x, BackendOptionsMap.kt). */
@Experimental class BackendOption(val key: String, val value: Int)

/** Compile-only stand-in of org.pytorch.executorch.BackendOptionsMap (executorch-android 1.5.x): per-backend load options. */
@Experimental
class BackendOptionsMap {
  fun setInt(backendName: String, key: String, value: Int): BackendOptionsMap = TODO("stub")
  fun isEmpty(): Boolean = TODO("stub")
}
