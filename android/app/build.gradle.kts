import org.jetbrains.kotlin.gradle.dsl.JvmTarget

plugins {
    id("com.android.application")
    id("org.jetbrains.kotlin.android")
}

android {
    namespace = "org.onphonellm.trainer.app"
    compileSdk = 35

    defaultConfig {
        applicationId = "org.onphonellm.trainer"
        minSdk = 26        // NotificationChannel (the glue); trainer-core is checked against API 23
        // 35 (Android 15): what Google Play requires of new apps and updates since 2025-08-31, and the highest
        // level AGP 8.9.0 is documented to support; 36 needs compileSdk 36 and a newer AGP (docs/android.md).
        targetSdk = 35
        versionCode = 1
        versionName = "0.1.0"
        ndk { abiFilters += listOf("arm64-v8a") }
    }
    buildTypes {
        release {
            isMinifyEnabled = false
        }
    }
    // Java 17 bytecode: Android Studio's bundled JBR (17 or 21) compiles it; no jvmToolchain (which would ask
    // Gradle to find or download a specific JDK).
    compileOptions {
        sourceCompatibility = JavaVersion.VERSION_17
        targetCompatibility = JavaVersion.VERSION_17
    }
    sourceSets["main"].java.srcDirs("src/main/kotlin")
}

kotlin {
    compilerOptions { jvmTarget.set(JvmTarget.JVM_17) }
}

// Pinned to the Python exporter's executorch (1.5.1, PyPI): the .pte format and the runtime must match. The
// coordinate org.pytorch:executorch-android is the one executorch's build publishes (coordinates(...) in
// extension/android/executorch_android/build.gradle); that 1.5.1 is on Maven Central could not be checked here.
val executorchVersion = "1.5.1"
val localExecutorchAar: String? = providers.gradleProperty("executorchAar").orNull

dependencies {
    implementation(project(":trainer-core"))
    if (localExecutorchAar != null) {
        implementation(files(localExecutorchAar))
        implementation("com.facebook.soloader:soloader:0.10.5")
        implementation("com.facebook.fbjni:fbjni:0.7.0")
    } else {
        implementation("org.pytorch:executorch-android:$executorchVersion")
    }
}
