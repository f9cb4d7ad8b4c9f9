import Foundation

/// Where the app keeps its files, under its Documents directory. `scripts/ios/push_program.sh` and
/// `pull_telemetry.sh` copy to and from these same relative paths with `xcrun devicectl`.
public struct AppPaths: Equatable {
    public static let programsDir = "Programs"
    public static let dataDir = "Data"
    public static let eventLog = "Telemetry/events.jsonl"
    public static let telemetryQueueDir = "Telemetry/queue"
    public static let checkpointsDir = "Checkpoints"
    public static let adaptersDir = "Adapters"

    public let documents: URL

    public init(documents: URL) { self.documents = documents }

    /// Documents/Programs: one exported program directory per subdirectory (manifest.json inside).
    public var programs: URL { documents.appendingPathComponent(Self.programsDir) }
    /// Documents/Data: JSONL training files.
    public var data: URL { documents.appendingPathComponent(Self.dataDir) }
    /// Documents/Telemetry/events.jsonl: every event of every run, append-only.
    public var eventLog: URL { documents.appendingPathComponent(Self.eventLog) }
    public var telemetryQueue: URL { documents.appendingPathComponent(Self.telemetryQueueDir) }
    /// One checkpoint per program: a new run of the same program resumes it until it is deleted.
    public func checkpoint(program: String) -> URL {
        documents.appendingPathComponent(Self.checkpointsDir).appendingPathComponent("\(program).safetensors")
    }
    /// The run to resume after the app was killed (`SavedRun`: its settings and its rows).
    public var latestRun: URL { documents.appendingPathComponent(Self.checkpointsDir).appendingPathComponent("latest-run.json") }
    public func adapter(runId: String) -> URL {
        documents.appendingPathComponent(Self.adaptersDir).appendingPathComponent(runId)
    }

    /// Names of the program directories (those holding a manifest.json), sorted; an import still
    /// under way (`.import-*`) is not one.
    public func programNames() -> [String] {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: programs.path)) ?? []
        return names.filter {
            !$0.hasPrefix(".") && FileManager.default.fileExists(atPath: programs.appendingPathComponent($0).appendingPathComponent(Contract.manifestName).path)
        }.sorted()
    }

    /// Directories iCloud / Finder backups must skip: programs (GBs of weights, re-copied from the
    /// computer), checkpoints (the state and its moments, GBs for larger ranks) and exported adapters
    /// (shared from the app when wanted). Data and telemetry stay in the backup (small, the user's).
    public var excludedFromBackup: [URL] {
        [programs, documents.appendingPathComponent(Self.checkpointsDir), documents.appendingPathComponent(Self.adaptersDir)]
    }

    /// Every directory the app writes to, created; `exclude` is called on each of
    /// `excludedFromBackup` (the app: `URLResourceValues.isExcludedFromBackup = true`, which covers
    /// everything inside). Run at every launch: a directory deleted in Files comes back excluded.
    /// Returns the directories `exclude` failed on.
    @discardableResult
    public func prepareDirectories(exclude: (URL) throws -> Void) -> [URL] {
        let all = [programs, data, documents.appendingPathComponent(Self.checkpointsDir), documents.appendingPathComponent(Self.adaptersDir),
                   telemetryQueue]
        for dir in all { try? FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true) }
        return excludedFromBackup.filter { url in (try? exclude(url)) == nil }
    }

    /// JSONL files in Documents/Data, sorted.
    public func dataFiles() -> [String] {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: data.path)) ?? []
        return names.filter { $0.hasSuffix(".jsonl") }.sorted()
    }
}
