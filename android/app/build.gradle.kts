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

// Versions: android/gradle.properties, one line each (executorchVersion: the Python exporter's executorch, 1.5.1
// on PyPI: the .pte format and the runtime must match). The coordinate org.pytorch:executorch-android is the one
// executorch's build publishes (coordinates(...) in extension/android/executorch_android/build.gradle); that
// 1.5.1 is on Maven Central could not be checked here.
fun pin(name: String): String = providers.gradleProperty(name).orNull ?: error("android/gradle.properties lacks $name")
val executorchVersion = pin("executorchVersion")
val localExecutorchAar: String? = providers.gradleProperty("executorchAar").orNull

dependencies {
    implementation(project(":trainer-core"))
    if (localExecutorchAar != null) {
        // A bare .aar brings no POM: the dependencies executorch-android's own build declares, at its versions.
        implementation(files(localExecutorchAar))
        implementation("com.facebook.fbjni:fbjni:${pin("fbjniVersion")}")
        implementation("com.facebook.soloader:nativeloader:${pin("nativeloaderVersion")}")
        implementation("androidx.core:core-ktx:${pin("coreKtxVersion")}")
    } else {
        implementation("org.pytorch:executorch-android:$executorchVersion")
    }
    implementation("androidx.work:work-runtime:${pin("workVersion")}")
}
