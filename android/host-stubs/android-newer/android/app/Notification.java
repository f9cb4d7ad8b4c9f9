package android.app;

/**
 * Compile-only stub shadowing android.jar's Notification: the members the glue uses, including the
 * Builder(Context, String channelId) constructor (API 26).
 */
public class Notification {
    public Notification() {}

    public static class Builder {
        public Builder(android.content.Context context, String channelId) { throw new RuntimeException("stub"); }
        public Builder setContentTitle(CharSequence title) { throw new RuntimeException("stub"); }
        public Builder setContentText(CharSequence text) { throw new RuntimeException("stub"); }
        public Builder setSmallIcon(int icon) { throw new RuntimeException("stub"); }
        public Builder setOngoing(boolean ongoing) { throw new RuntimeException("stub"); }
        public Builder setOnlyAlertOnce(boolean onlyAlertOnce) { throw new RuntimeException("stub"); }
        public Builder setProgress(int max, int progress, boolean indeterminate) { throw new RuntimeException("stub"); }
        public Builder setContentIntent(PendingIntent intent) { throw new RuntimeException("stub"); }
        public Notification build() { throw new RuntimeException("stub"); }
    }
}
