import Foundation
import XCTest
@testable import TrainerCore

/// The repository's shared files. The root is TRAINER_REPO_ROOT if set, else the first directory
/// above this source file that holds shared_schemas/manifest.schema.json (works from any checkout
/// path, and inside the test chroot where the repository is mounted at /repo).
enum Repo {
    static let root: URL = {
        if let env = ProcessInfo.processInfo.environment["TRAINER_REPO_ROOT"], !env.isEmpty {
            return URL(fileURLWithPath: env)
        }
        var dir = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        while dir.path != "/" {
            if FileManager.default.fileExists(atPath: dir.appendingPathComponent("shared_schemas/manifest.schema.json").path) {
                return dir
            }
            dir = dir.deletingLastPathComponent()
        }
        fatalError("shared_schemas/ not found above \(#filePath); set TRAINER_REPO_ROOT")
    }()

    static var examples: URL { root.appendingPathComponent("shared_schemas/examples") }
    static var invalid: URL { examples.appendingPathComponent("invalid") }
    static var fixtures: URL { URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("Fixtures") }

    /// A manifest of shared_schemas/examples/ by name.
    static func manifest(_ name: String) -> URL {
        examples.appendingPathComponent(name)
    }

    /// Files of `dir` whose name starts with `prefix` and ends in .json, sorted.
    static func files(_ dir: URL, prefix: String) -> [URL] {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: dir.path)) ?? []
        return names.filter { $0.hasPrefix(prefix) && $0.hasSuffix(".json") }.sorted().map { dir.appendingPathComponent($0) }
    }

    static func data(_ url: URL) throws -> Data { try Data(contentsOf: url) }
}

/// Rows of 3..6 byte tokens; row 0 masks its first label.
func tinyRows(_ n: Int = 5) -> [DataRow] {
    var rows: [DataRow] = []
    for i in 0..<n {
        var ids: [Int64] = []
        for t in 0..<(3 + i % 4) {
            let id: Int = 65 + (i * 7 + t * 3) % 26
            ids.append(Int64(id))
        }
        var labels: [Int64]? = nil
        if i == 0 {
            labels = ids
            labels![0] = -100
        }
        rows.append(DataRow(inputIds: ids, labels: labels))
    }
    return rows
}

func tempDir(_ name: String = #function) throws -> URL {
    let dir = FileManager.default.temporaryDirectory
        .appendingPathComponent("trainercore-\(name.filter(\.isLetter))-\(UUID().uuidString)")
    try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
    return dir
}

/// A probe that returns scripted samples in order (the last one repeats).
final class ScriptedProbe: MemoryProbe {
    var samples: [MemorySample]
    private var i = 0
    init(_ samples: [MemorySample]) { self.samples = samples }
    func sample() -> MemorySample? {
        defer { i += 1 }
        return samples.isEmpty ? nil : samples[min(i, samples.count - 1)]
    }
}

/// A transport that answers from a script and records every request.
final class ScriptedTransport: TelemetryTransport {
    var answers: [TransportResult]
    private(set) var requests: [TelemetryRequest] = []
    init(_ answers: [TransportResult]) { self.answers = answers }
    func post(_ request: TelemetryRequest) -> TransportResult {
        requests.append(request)
        return answers.isEmpty ? .status(200) : answers.removeFirst()
    }
}

/// Collects events in memory.
final class MemorySink: TelemetrySink {
    var events: [TelemetryEvent] = []
    func append(_ event: TelemetryEvent) throws { events.append(event) }
}

let testDevice = DeviceInfo(deviceModel: "iPhone16,1", os: "iOS 18.1", totalRamBytes: 8 << 30, budgetBytes: 2 << 30)

/// A fixed clock that advances by `tick` seconds at every reading.
final class TickClock {
    var now: Double
    let tick: Double
    init(start: Double = 1_767_225_600, tick: Double = 0.25) { (now, self.tick) = (start, tick) }
    func read() -> Double { defer { now += tick }; return now }
}

/// A program directory under `dir` for the manifest `example` (`Repo.manifest`): its manifest, a synthetic
/// weights file and a state_init.bin (the tiny examples' tokenizer is the byte one: no file needed).
func syntheticProgram(in dir: URL, example: String = "manifest_tiny_generate.json") throws -> (URL, Manifest) {
    let p = dir.appendingPathComponent("program-\(UUID().uuidString.prefix(6))")
    try FileManager.default.createDirectory(at: p, withIntermediateDirectories: true)
    try FileManager.default.copyItem(at: Repo.manifest(example), to: p.appendingPathComponent("manifest.json"))
    let m = try Manifest.load(directory: p)
    try SyntheticWeights.write(for: m, to: p.appendingPathComponent(m.weights.file))
    try StateFile.encode((0..<m.state.numel).map { Float($0 % 13) / 100 }).write(to: p.appendingPathComponent(m.state.initFile))
    return (p, m)
}
