package androidx.work;

import android.content.Context;

/** Compile-only stand-in. */
public abstract class WorkManager {
    public static WorkManager getInstance(Context context) { throw new UnsupportedOperationException("stub"); }
    public abstract Operation enqueueUniquePeriodicWork(String uniqueWorkName, ExistingPeriodicWorkPolicy existingPeriodicWorkPolicy, PeriodicWorkRequest periodicWork);
    public abstract Operation cancelUniqueWork(String uniqueWorkName);
}
