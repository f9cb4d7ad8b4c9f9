// Pure Kotlin (no android.*): manifest and plan parsing, LCSB schedule, data batching, memory budget
// guard, checkpoint/resume, telemetry queue and upload, safetensors adapter writer. JVM-tested.
plugins {
    id("org.jetbrains.kotlin.jvm")
}

kotlin {
    jvmToolchain(17)
}

dependencies {
    testImplementation("org.junit.jupiter:junit-jupiter:5.9.2")
    testRuntimeOnly("org.junit.platform:junit-platform-launcher")
}

tasks.test {
    useJUnitPlatform()
    // The tests read shared_schemas/ (and ../shared/android-samples when present) from the repository.
    systemProperty("repo.root", rootDir.parentFile.absolutePath)
}
