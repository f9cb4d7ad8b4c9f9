package androidx.work;

import android.content.Context;
import com.google.common.util.concurrent.ListenableFuture;

/** Compile-only stand-in for androidx.work:work-runtime 2.x (developer.android.com/reference/androidx/work/ListenableWorker). */
public abstract class ListenableWorker {
    public ListenableWorker(Context appContext, WorkerParameters workerParams) { throw new UnsupportedOperationException("stub"); }
    public final Context getApplicationContext() { throw new UnsupportedOperationException("stub"); }
    public final boolean isStopped() { throw new UnsupportedOperationException("stub"); }
    public void onStopped() { throw new UnsupportedOperationException("stub"); }
    public final ListenableFuture<Void> setForegroundAsync(ForegroundInfo foregroundInfo) { throw new UnsupportedOperationException("stub"); }

    public abstract static class Result {
        public static Result success() { throw new UnsupportedOperationException("stub"); }
        public static Result retry() { throw new UnsupportedOperationException("stub"); }
        public static Result failure() { throw new UnsupportedOperationException("stub"); }
    }
}
