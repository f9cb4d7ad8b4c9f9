package android.app;

/** Compile-only stub (API 31): thrown by startService / startForegroundService when the app may not start a service. */
public abstract class ServiceStartNotAllowedException extends IllegalStateException {
    ServiceStartNotAllowedException(String message) { super(message); }
}
