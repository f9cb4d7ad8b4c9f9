package androidx.work;

/** Compile-only stand-in. */
public enum ExistingPeriodicWorkPolicy { KEEP, UPDATE, CANCEL_AND_REENQUEUE }
