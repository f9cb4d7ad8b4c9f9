package org.pytorch.executorch;

/**
 * Compile-only stub of org.pytorch.executorch.EValue (executorch-android 1.5.x, EValue.kt): Kotlin
 * properties `isTensor`, `isNone`, ... appear as their JVM getters isTensor(), isNone(), ...
 */
public class EValue {
    private EValue() {}

    public static EValue optionalNone() { throw new UnsupportedOperationException("stub"); }
    public static EValue from(Tensor tensor) { throw new UnsupportedOperationException("stub"); }
    public static EValue from(boolean value) { throw new UnsupportedOperationException("stub"); }
    public static EValue from(long value) { throw new UnsupportedOperationException("stub"); }
    public static EValue from(double value) { throw new UnsupportedOperationException("stub"); }
    public static EValue from(String value) { throw new UnsupportedOperationException("stub"); }
    public static EValue fromByteArray(byte[] bytes) { throw new UnsupportedOperationException("stub"); }

    public final boolean isNone() { throw new UnsupportedOperationException("stub"); }
    public final boolean isTensor() { throw new UnsupportedOperationException("stub"); }
    public final boolean isBool() { throw new UnsupportedOperationException("stub"); }
    public final boolean isInt() { throw new UnsupportedOperationException("stub"); }
    public final boolean isDouble() { throw new UnsupportedOperationException("stub"); }
    public final boolean isString() { throw new UnsupportedOperationException("stub"); }
    public final Tensor toTensor() { throw new UnsupportedOperationException("stub"); }
    public final boolean toBool() { throw new UnsupportedOperationException("stub"); }
    public final long toInt() { throw new UnsupportedOperationException("stub"); }
    public final double toDouble() { throw new UnsupportedOperationException("stub"); }
    public final String toStr() { throw new UnsupportedOperationException("stub"); }
    public final byte[] toByteArray() { throw new UnsupportedOperationException("stub"); }
}
