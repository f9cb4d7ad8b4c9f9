package android.content.pm;

/**
 * Compile-only stub shadowing android.jar's ServiceInfo for FOREGROUND_SERVICE_TYPE_SPECIAL_USE (API 34),
 * the type passed to startForeground(int, Notification, int). Only the members the glue uses.
 */
public class ServiceInfo extends ComponentInfo {
    public static final int FOREGROUND_SERVICE_TYPE_SPECIAL_USE = 0x40000000;
    public ServiceInfo() {}
}
