package androidx.work;

/** Compile-only stand-in. */
public interface Operation {
}
