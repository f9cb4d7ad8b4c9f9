package android.app;

/** Compile-only stub: android.app.NotificationChannel (API 26). */
public final class NotificationChannel {
    public NotificationChannel(String id, CharSequence name, int importance) { throw new RuntimeException("stub"); }
    public void setDescription(String description) { throw new RuntimeException("stub"); }
    public String getId() { throw new RuntimeException("stub"); }
}
