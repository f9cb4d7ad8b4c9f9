package org.pytorch.executorch.annotations

/** Compile-only stand-in of org.pytorch.executorch.annotations.Experimental (executorch-android 1.5.x). */
@Retention(AnnotationRetention.BINARY) annotation class Experimental
