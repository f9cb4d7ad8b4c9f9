package androidx.work;

import java.util.concurrent.TimeUnit;

/** Compile-only stand-in (the Java builder; Kotlin's PeriodicWorkRequestBuilder is an inline wrapper of it). */
public final class PeriodicWorkRequest extends WorkRequest {
    private PeriodicWorkRequest() { }

    public static final class Builder {
        public Builder(Class<? extends ListenableWorker> workerClass, long repeatInterval, TimeUnit repeatIntervalTimeUnit) { throw new UnsupportedOperationException("stub"); }
        public Builder setConstraints(Constraints constraints) { throw new UnsupportedOperationException("stub"); }
        public PeriodicWorkRequest build() { throw new UnsupportedOperationException("stub"); }
    }
}
