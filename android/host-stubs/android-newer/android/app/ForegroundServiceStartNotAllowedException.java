package android.app;

/**
 * Compile-only stub (API 31): thrown by Context.startForegroundService and Service.startForeground when
 * the app is in the background and not exempt (Android 12+), e.g. a sticky restart after a process kill.
 */
public final class ForegroundServiceStartNotAllowedException extends ServiceStartNotAllowedException {
    public ForegroundServiceStartNotAllowedException(String message) { super(message); }
}
