package androidx.work;

import android.content.Context;

/** Compile-only stand-in: a ListenableWorker whose doWork runs on WorkManager's background executor. */
public abstract class Worker extends ListenableWorker {
    public Worker(Context context, WorkerParameters workerParams) { super(context, workerParams); }
    public abstract Result doWork();
}
