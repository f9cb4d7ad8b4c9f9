package androidx.work;

/** Compile-only stand-in. */
public final class Constraints {
    private Constraints() { }

    public static final class Builder {
        public Builder() { }
        public Builder setRequiresCharging(boolean requiresCharging) { throw new UnsupportedOperationException("stub"); }
        public Builder setRequiresDeviceIdle(boolean requiresDeviceIdle) { throw new UnsupportedOperationException("stub"); }
        public Builder setRequiresBatteryNotLow(boolean requiresBatteryNotLow) { throw new UnsupportedOperationException("stub"); }
        public Builder setRequiresStorageNotLow(boolean requiresStorageNotLow) { throw new UnsupportedOperationException("stub"); }
        public Constraints build() { throw new UnsupportedOperationException("stub"); }
    }
}
