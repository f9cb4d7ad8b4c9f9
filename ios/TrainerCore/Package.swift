// swift-tools-version:5.9
// TrainerCore: the app-independent half of the iOS trainer (manifest, LCSB schedule, data, budget
// guard, checkpoints, telemetry, adapter export). Foundation only, so `swift test` runs on Linux.
import PackageDescription

let package = Package(
    name: "TrainerCore",
    platforms: [.iOS(.v17), .macOS(.v13)],
    products: [
        .library(name: "TrainerCore", targets: ["TrainerCore"]),
    ],
    targets: [
        .target(name: "TrainerCore"),
        .testTarget(name: "TrainerCoreTests", dependencies: ["TrainerCore"], exclude: ["Fixtures"]),
    ]
)
