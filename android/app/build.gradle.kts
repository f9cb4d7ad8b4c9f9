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
        targetSdk = 34     // foregroundServiceType="specialUse" is declared for Android 14+
        versionCode = 1
        versionName = "0.1.0"
        ndk { abiFilters += listOf("arm64-v8a") }
    }
    buildTypes {
        release {
            isMinifyEnabled = false
        }
    }
    compileOptions {
        sourceCompatibility = JavaVersion.VERSION_17
        targetCompatibility = JavaVersion.VERSION_17
    }
    sourceSets["main"].java.srcDirs("src/main/kotlin")
}

kotlin {
    compilerOptions { jvmTarget.set(JvmTarget.JVM_17) }
}

// Pinned to the Python exporter's executorch (1.5.1): the .pte format and the runtime must match.
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
