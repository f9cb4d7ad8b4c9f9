package org.pytorch.executorch;

/** Compile-only stub of org.pytorch.executorch.ExecutorchRuntimeException (executorch-android 1.5.1). */
public class ExecutorchRuntimeException extends RuntimeException {
    public ExecutorchRuntimeException(int errorCode, String details) { super(details); }
    public int getErrorCode() { throw new UnsupportedOperationException("stub"); }
    public String getDetailedError() { throw new UnsupportedOperationException("stub"); }
}
