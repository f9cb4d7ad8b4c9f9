package android.app;

import android.content.ComponentCallbacks2;
import android.content.ContextWrapper;
import android.content.Intent;
import android.content.res.Configuration;
import android.os.IBinder;

/**
 * Compile-only stub shadowing android.jar's (API 23) Service: the members the glue uses, including
 * startForeground(int, Notification, int) (API 29) and stopForeground(int) with STOP_FOREGROUND_REMOVE
 * (API 24), with developer.android.com's signatures.
 */
public abstract class Service extends ContextWrapper implements ComponentCallbacks2 {
    public static final int START_STICKY_COMPATIBILITY = 0;
    public static final int START_STICKY = 1;
    public static final int START_NOT_STICKY = 2;
    public static final int START_REDELIVER_INTENT = 3;
    public static final int START_FLAG_REDELIVERY = 1;
    public static final int START_FLAG_RETRY = 2;
    public static final int STOP_FOREGROUND_REMOVE = 1;
    public static final int STOP_FOREGROUND_DETACH = 2;

    public Service() { super(null); }

    public void onCreate() {}
    public int onStartCommand(Intent intent, int flags, int startId) { throw new RuntimeException("stub"); }
    public void onDestroy() {}
    public void onConfigurationChanged(Configuration newConfig) {}
    public void onLowMemory() {}
    public void onTrimMemory(int level) {}
    public abstract IBinder onBind(Intent intent);
    public final void stopSelf() { throw new RuntimeException("stub"); }
    public final void stopSelf(int startId) { throw new RuntimeException("stub"); }
    public final void startForeground(int id, Notification notification) { throw new RuntimeException("stub"); }
    public final void startForeground(int id, Notification notification, int foregroundServiceType) { throw new RuntimeException("stub"); }
    @Deprecated public final void stopForeground(boolean removeNotification) { throw new RuntimeException("stub"); }
    public final void stopForeground(int notificationBehavior) { throw new RuntimeException("stub"); }
}
