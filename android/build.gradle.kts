// Versions: AGP 8.9.0 + Gradle 8.11.1 is the pair pytorch/executorch builds its own AAR with
// (extension/android/executorch_android/build.gradle, extension/android/gradle/wrapper/gradle-wrapper.properties);
// Kotlin 2.1.0 supports AGP 8.9. See docs/android.md, "Building with Android Studio".
plugins {
    id("com.android.application") version "8.9.0" apply false
    id("org.jetbrains.kotlin.android") version "2.1.0" apply false
    id("org.jetbrains.kotlin.jvm") version "2.1.0" apply false
}
