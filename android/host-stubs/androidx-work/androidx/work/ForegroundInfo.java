package androidx.work;

import android.app.Notification;

/** Compile-only stand-in: the notification (and, API 29+, the foreground service type) of a long-running worker. */
public final class ForegroundInfo {
    public ForegroundInfo(int notificationId, Notification notification) { throw new UnsupportedOperationException("stub"); }
    public ForegroundInfo(int notificationId, Notification notification, int foregroundServiceType) { throw new UnsupportedOperationException("stub"); }
}
