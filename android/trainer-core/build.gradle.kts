// Pure Kotlin (no android.*): the contract-v3 layer loop and training session, tokenizers and on-device data
// preparation, memory budget guard, checkpoint/resume, telemetry, PEFT adapter writer. JVM-tested.
import org.jetbrains.kotlin.gradle.dsl.JvmTarget

plugins {
    id("org.jetbrains.kotlin.jvm")
}

// Java 17 bytecode from whatever JDK runs Gradle (Android Studio's JBR): no jvmToolchain, which would make
// Gradle look for (or auto-provision) a specific JDK.
java {
    sourceCompatibility = JavaVersion.VERSION_17
    targetCompatibility = JavaVersion.VERSION_17
}
kotlin {
    compilerOptions { jvmTarget.set(JvmTarget.JVM_17) }
}

dependencies {
    testImplementation("org.junit.jupiter:junit-jupiter:5.9.2")
    testRuntimeOnly("org.junit.platform:junit-platform-launcher")
}

tasks.test {
    useJUnitPlatform()
    // The tests read shared_schemas/ (and ../shared/android-samples when present) from the repository.
    systemProperty("repo.root", rootDir.parentFile.absolutePath)
    // The Qwen2.5 tokenizer.json for TokenizerTest / DataCorpusTest (android/test.sh writes one; else skipped).
    providers.gradleProperty("qwenTokenizer").orNull?.let { systemProperty("qwen.tokenizer", it) }
}
