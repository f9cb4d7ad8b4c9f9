package androidx.work;

/** Compile-only stand-in. */
public final class WorkerParameters {
    private WorkerParameters() { }
}
