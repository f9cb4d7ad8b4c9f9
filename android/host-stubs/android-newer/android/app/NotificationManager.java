package android.app;

/**
 * Compile-only stub shadowing android.jar's NotificationManager: the members the glue uses, including
 * IMPORTANCE_LOW (API 24) and createNotificationChannel (API 26).
 */
public class NotificationManager {
    public static final int IMPORTANCE_LOW = 2;
    public static final int IMPORTANCE_DEFAULT = 3;

    NotificationManager() {}

    public void createNotificationChannel(NotificationChannel channel) { throw new RuntimeException("stub"); }
    public void notify(int id, Notification notification) { throw new RuntimeException("stub"); }
    public void cancel(int id) { throw new RuntimeException("stub"); }
}
