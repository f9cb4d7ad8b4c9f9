// Android side of the toolchain: the demo app and its pure-Kotlin trainer core.
// Build on a machine with the Android SDK: `gradle wrapper` once (or open in Android Studio), then
// `./gradlew :trainer-core:test :app:assembleDebug`. The host checks run without Gradle: android/test.sh.
pluginManagement {
    repositories {
        google()
        mavenCentral()
        gradlePluginPortal()
    }
}
dependencyResolutionManagement {
    repositoriesMode.set(RepositoriesMode.FAIL_ON_PROJECT_REPOS)
    repositories {
        google()
        mavenCentral()
    }
}
rootProject.name = "toolchain-android"
include(":trainer-core", ":app")
