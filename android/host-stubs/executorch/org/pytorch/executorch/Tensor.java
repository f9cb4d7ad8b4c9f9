package org.pytorch.executorch;

/** Compile-only stub of org.pytorch.executorch.Tensor (executorch-android 1.5.1). */
public abstract class Tensor {
    Tensor() {}

    public static Tensor fromBlob(long[] data, long[] shape) { throw new UnsupportedOperationException("stub"); }
    public static Tensor fromBlob(float[] data, long[] shape) { throw new UnsupportedOperationException("stub"); }
    public static Tensor fromBlob(int[] data, long[] shape) { throw new UnsupportedOperationException("stub"); }
    public static Tensor fromBlob(double[] data, long[] shape) { throw new UnsupportedOperationException("stub"); }
    public static long numel(long[] shape) { throw new UnsupportedOperationException("stub"); }

    public long numel() { throw new UnsupportedOperationException("stub"); }
    public long[] shape() { throw new UnsupportedOperationException("stub"); }
    public float[] getDataAsFloatArray() { throw new UnsupportedOperationException("stub"); }
    public long[] getDataAsLongArray() { throw new UnsupportedOperationException("stub"); }
    public int[] getDataAsIntArray() { throw new UnsupportedOperationException("stub"); }
}
