package org.pytorch.executorch;

/**
 * Compile-only stub of org.pytorch.executorch.Module (executorch-android 1.5.x, Module.kt): `load` is
 * a @JvmStatic @JvmOverloads companion function (modelPath, loadMode = LOAD_MODE_FILE, numThreads = 0),
 * hence the three overloads; `execute` takes a vararg. The backend-options `load` overload of main is
 * left out (the app does not use it).
 */
public class Module implements java.io.Closeable {
    public static final int LOAD_MODE_FILE = 0;
    public static final int LOAD_MODE_MMAP = 1;
    public static final int LOAD_MODE_MMAP_USE_MLOCK = 2;
    public static final int LOAD_MODE_MMAP_USE_MLOCK_IGNORE_ERRORS = 3;

    private Module() {}

    public static Module load(String modelPath, int loadMode, int numThreads) { throw new UnsupportedOperationException("stub"); }
    public static Module load(String modelPath, int loadMode) { throw new UnsupportedOperationException("stub"); }
    public static Module load(String modelPath) { throw new UnsupportedOperationException("stub"); }

    public EValue[] forward(EValue... inputs) { throw new UnsupportedOperationException("stub"); }
    public EValue[] execute(String methodName, EValue... inputs) { throw new UnsupportedOperationException("stub"); }
    public void loadMethod(String methodName) { throw new UnsupportedOperationException("stub"); }
    public String[] getMethods() { throw new UnsupportedOperationException("stub"); }
    public String[] readLogBuffer() { throw new UnsupportedOperationException("stub"); }
    public boolean etdump() { throw new UnsupportedOperationException("stub"); }
    public boolean etdump(String outputPath) { throw new UnsupportedOperationException("stub"); }
    public void destroy() { throw new UnsupportedOperationException("stub"); }
    @Override public void close() { throw new UnsupportedOperationException("stub"); }

    public static String[] readLogBufferStatic() { throw new UnsupportedOperationException("stub"); }
}
