package androidx.work;

/** Compile-only stand-in. */
public abstract class WorkRequest {
}
