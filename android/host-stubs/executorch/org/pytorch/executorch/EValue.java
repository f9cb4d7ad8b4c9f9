package org.pytorch.executorch;

/** Compile-only stub of org.pytorch.executorch.EValue (executorch-android 1.5.1). */
public class EValue {
    private EValue() {}

    public static EValue from(Tensor tensor) { throw new UnsupportedOperationException("stub"); }
    public static EValue from(boolean value) { throw new UnsupportedOperationException("stub"); }
    public static EValue from(long value) { throw new UnsupportedOperationException("stub"); }
    public static EValue from(double value) { throw new UnsupportedOperationException("stub"); }
    public static EValue from(String value) { throw new UnsupportedOperationException("stub"); }
    public static EValue optionalNone() { throw new UnsupportedOperationException("stub"); }

    public boolean isTensor() { throw new UnsupportedOperationException("stub"); }
    public boolean isNone() { throw new UnsupportedOperationException("stub"); }
    public Tensor toTensor() { throw new UnsupportedOperationException("stub"); }
    public long toInt() { throw new UnsupportedOperationException("stub"); }
    public double toDouble() { throw new UnsupportedOperationException("stub"); }
}
