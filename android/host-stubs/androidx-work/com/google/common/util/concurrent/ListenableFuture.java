package com.google.common.util.concurrent;

/** Compile-only stand-in (guava's listenablefuture artifact, what WorkManager returns). */
public interface ListenableFuture<V> extends java.util.concurrent.Future<V> {
    void addListener(Runnable listener, java.util.concurrent.Executor executor);
}
