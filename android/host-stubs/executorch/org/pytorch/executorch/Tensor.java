package org.pytorch.executorch;

import java.nio.Buffer;
import java.nio.ByteBuffer;
import java.nio.DoubleBuffer;
import java.nio.FloatBuffer;
import java.nio.IntBuffer;
import java.nio.LongBuffer;
import java.nio.ShortBuffer;

/**
 * Compile-only stub of org.pytorch.executorch.Tensor (executorch-android 1.5.x; Tensor.kt, the same
 * public API on release/1.4 and on main at version 1.5.0). Kotlin properties appear as their JVM
 * getters (`dataAsFloatArray` -> getDataAsFloatArray()); companion members marked @JvmStatic as
 * static methods.
 */
public abstract class Tensor {
    Tensor() {}

    // Factories. The Buffer overloads require a direct buffer in native byte order whose capacity equals
    // numel(shape) (checked in Kotlin); the JNI then reads the buffer's memory by address.
    public static ByteBuffer allocateByteBuffer(int numElements) { throw new UnsupportedOperationException("stub"); }
    public static IntBuffer allocateIntBuffer(int numElements) { throw new UnsupportedOperationException("stub"); }
    public static FloatBuffer allocateFloatBuffer(int numElements) { throw new UnsupportedOperationException("stub"); }
    public static LongBuffer allocateLongBuffer(int numElements) { throw new UnsupportedOperationException("stub"); }
    public static ShortBuffer allocateHalfBuffer(int numElements) { throw new UnsupportedOperationException("stub"); }
    public static DoubleBuffer allocateDoubleBuffer(int numElements) { throw new UnsupportedOperationException("stub"); }

    public static Tensor fromBlobUnsigned(byte[] data, long[] shape) { throw new UnsupportedOperationException("stub"); }
    public static Tensor fromBlob(byte[] data, long[] shape) { throw new UnsupportedOperationException("stub"); }
    public static Tensor fromBlob(int[] data, long[] shape) { throw new UnsupportedOperationException("stub"); }
    public static Tensor fromBlob(float[] data, long[] shape) { throw new UnsupportedOperationException("stub"); }
    public static Tensor fromBlob(short[] data, long[] shape) { throw new UnsupportedOperationException("stub"); }
    public static Tensor fromBlob(long[] data, long[] shape) { throw new UnsupportedOperationException("stub"); }
    public static Tensor fromBlob(double[] data, long[] shape) { throw new UnsupportedOperationException("stub"); }
    public static Tensor fromBlobUnsigned(ByteBuffer data, long[] shape) { throw new UnsupportedOperationException("stub"); }
    public static Tensor fromBlob(ByteBuffer data, long[] shape) { throw new UnsupportedOperationException("stub"); }
    public static Tensor fromBlob(IntBuffer data, long[] shape) { throw new UnsupportedOperationException("stub"); }
    public static Tensor fromBlob(FloatBuffer data, long[] shape) { throw new UnsupportedOperationException("stub"); }
    public static Tensor fromBlob(ShortBuffer data, long[] shape) { throw new UnsupportedOperationException("stub"); }
    public static Tensor fromBlob(LongBuffer data, long[] shape) { throw new UnsupportedOperationException("stub"); }
    public static Tensor fromBlob(DoubleBuffer data, long[] shape) { throw new UnsupportedOperationException("stub"); }
    public static Tensor ones(long[] shape, DType dtype) { throw new UnsupportedOperationException("stub"); }
    public static Tensor zeros(long[] shape, DType dtype) { throw new UnsupportedOperationException("stub"); }
    public static long numel(long[] shape) { throw new UnsupportedOperationException("stub"); }
    public static Tensor fromByteArray(byte[] bytes) { throw new UnsupportedOperationException("stub"); }

    public final long numel() { throw new UnsupportedOperationException("stub"); }
    public final long[] shape() { throw new UnsupportedOperationException("stub"); }
    public abstract DType dtype();
    public final int dtypeJniCode() { throw new UnsupportedOperationException("stub"); }

    public byte[] getDataAsByteArray() { throw new UnsupportedOperationException("stub"); }
    public short[] getDataAsShortArray() { throw new UnsupportedOperationException("stub"); }
    public byte[] getDataAsUnsignedByteArray() { throw new UnsupportedOperationException("stub"); }
    public int[] getDataAsIntArray() { throw new UnsupportedOperationException("stub"); }
    public float[] getDataAsFloatArray() { throw new UnsupportedOperationException("stub"); }
    public long[] getDataAsLongArray() { throw new UnsupportedOperationException("stub"); }
    public double[] getDataAsDoubleArray() { throw new UnsupportedOperationException("stub"); }

    // Copy the tensor's data into dst at dst's position (dst.put(data)): no intermediate array.
    public void copyDataInto(FloatBuffer dst) { throw new UnsupportedOperationException("stub"); }
    public void copyDataInto(ByteBuffer dst) { throw new UnsupportedOperationException("stub"); }
    public void copyDataIntoUnsigned(ByteBuffer dst) { throw new UnsupportedOperationException("stub"); }
    public void copyDataInto(IntBuffer dst) { throw new UnsupportedOperationException("stub"); }
    public void copyDataInto(LongBuffer dst) { throw new UnsupportedOperationException("stub"); }
    public void copyDataInto(DoubleBuffer dst) { throw new UnsupportedOperationException("stub"); }
    public void copyDataInto(ShortBuffer dst) { throw new UnsupportedOperationException("stub"); }

    public Buffer getRawDataBuffer() { throw new UnsupportedOperationException("stub"); }
    public final byte[] toByteArray() { throw new UnsupportedOperationException("stub"); }
}
