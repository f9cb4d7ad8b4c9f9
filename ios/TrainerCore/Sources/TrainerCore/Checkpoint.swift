import Foundation
#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif

/// Crash-safe file writes: a temporary file in the same directory, flushed to disk, then renamed
/// over the target (rename is atomic on APFS and ext4), so a kill leaves the old file or the new one.
public enum AtomicFiles {
    static let tmpMarker = ".tmp-"

    public static func write(_ data: Data, to url: URL) throws {
        let dir = url.deletingLastPathComponent()
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        let tmp = dir.appendingPathComponent(".\(url.lastPathComponent)\(tmpMarker)\(UUID().uuidString)")
        guard FileManager.default.createFile(atPath: tmp.path, contents: nil) else {
            throw TrainerError.io("cannot create \(tmp.path)")
        }
        do {
            let h = try FileHandle(forWritingTo: tmp)
            defer { try? h.close() }
            try h.write(contentsOf: data)
            try h.synchronize()
        } catch {
            try? FileManager.default.removeItem(at: tmp)
            throw TrainerError.io("cannot write \(url.path): \(error.localizedDescription)")
        }
        guard rename(tmp.path, url.path) == 0 else {
            let why = String(cString: strerror(errno))
            try? FileManager.default.removeItem(at: tmp)
            throw TrainerError.io("cannot move the new \(url.lastPathComponent) into place: \(why)")
        }
        syncDirectory(dir)
    }

    /// Build a directory's new content in a temporary sibling, then swap it in.
    public static func replaceDirectory(_ url: URL, fill: (URL) throws -> Void) throws {
        let fm = FileManager.default
        let parent = url.deletingLastPathComponent()
        try fm.createDirectory(at: parent, withIntermediateDirectories: true)
        let tmp = parent.appendingPathComponent(".\(url.lastPathComponent)\(tmpMarker)\(UUID().uuidString)")
        try fm.createDirectory(at: tmp, withIntermediateDirectories: false)
        do {
            try fill(tmp)
            let old = parent.appendingPathComponent(".\(url.lastPathComponent).old-\(UUID().uuidString)")
            if fm.fileExists(atPath: url.path) { try fm.moveItem(at: url, to: old) }
            try fm.moveItem(at: tmp, to: url)
            try? fm.removeItem(at: old)
            syncDirectory(parent)
        } catch {
            try? fm.removeItem(at: tmp)
            throw error
        }
    }

    /// Remove temporary files a killed write left behind in `dir`.
    @discardableResult
    public static func removeLeftovers(in dir: URL) -> Int {
        let names = (try? FileManager.default.contentsOfDirectory(atPath: dir.path)) ?? []
        var removed = 0
        for name in names where name.hasPrefix(".") && name.contains(tmpMarker) {
            if (try? FileManager.default.removeItem(at: dir.appendingPathComponent(name))) != nil { removed += 1 }
        }
        return removed
    }

    private static func syncDirectory(_ dir: URL) {
        let fd = open(dir.path, O_RDONLY)
        if fd >= 0 {
            _ = fsync(fd)
            _ = close(fd)
        }
    }
}

/// Where a run stands, saved with the state so a killed app resumes where it stopped.
public struct CheckpointMeta: Codable, Equatable {
    /// Steps completed (the next step to run).
    public var step: Int
    public var runId: String
    /// Next telemetry sequence number of the run.
    public var seq: Int
    /// Loss of every completed step (null when not finite), as the host runner keeps them.
    public var losses: [Float?]
    /// Size of the state, name of the program and sha256 of its program file (manifest `files`), so
    /// a re-export with the same state size is not resumed by mistake (absent in host checkpoints).
    public var stateNumel: Int?
    public var program: String?
    public var programSha256: String?

    public init(step: Int, runId: String, seq: Int, losses: [Float?], stateNumel: Int? = nil, program: String? = nil,
                programSha256: String? = nil) {
        (self.step, self.runId, self.seq, self.losses) = (step, runId, seq, losses)
        (self.stateNumel, self.program, self.programSha256) = (stateNumel, program, programSha256)
    }

    enum CodingKeys: String, CodingKey {
        case step, runId = "run_id", seq, losses, stateNumel = "state_numel", program, programSha256 = "program_sha256"
    }
}

/// The run's checkpoint: one safetensors file (tensor `state` float32[N], metadata `meta` = JSON),
/// the layout the host runner (`toolchain/training/checkpoint.py`) writes, so either side can resume the
/// other's checkpoint; replaced atomically.
public struct CheckpointStore {
    public let url: URL

    public init(url: URL) { self.url = url }

    public var exists: Bool { FileManager.default.fileExists(atPath: url.path) }

    public func save(state: [Float], meta: CheckpointMeta) throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        let metaJSON = String(decoding: try encoder.encode(meta), as: UTF8.self)
        let data = try Safetensors.encode([NamedTensor(name: "state", shape: [state.count], values: state)],
                                          metadata: ["meta": metaJSON])
        try AtomicFiles.write(data, to: url)
    }

    /// The saved state and meta, checked against the program (numel, and the program file's sha256
    /// when both sides know it).
    public func load(expectedNumel: Int, programSha256: String? = nil) throws -> (state: [Float], meta: CheckpointMeta) {
        AtomicFiles.removeLeftovers(in: url.deletingLastPathComponent())
        let data = try readFile(url, what: "checkpoint")
        func fail(_ why: String) -> TrainerError { .badInput("checkpoint \(url.path) is unreadable (\(why)); delete it to start over") }
        let decoded: (tensors: [String: NamedTensor], metadata: [String: String])
        do { decoded = try Safetensors.decode(data) } catch { throw fail("\(error)") }
        guard let state = decoded.tensors["state"]?.values else { throw fail("no 'state' tensor") }
        guard let metaText = decoded.metadata["meta"],
              let meta = try? JSONDecoder().decode(CheckpointMeta.self, from: Data(metaText.utf8)) else {
            throw fail("no run metadata")
        }
        guard state.count == expectedNumel, meta.stateNumel ?? expectedNumel == expectedNumel else {
            throw TrainerError.badInput("checkpoint \(url.path) has \(state.count) state values, the program \(expectedNumel); it belongs to another program (delete it to start over)")
        }
        if let want = programSha256, let got = meta.programSha256, want != got {
            throw TrainerError.badInput("checkpoint \(url.path) was saved by another export of this program (sha256 \(got.prefix(12))..., now \(want.prefix(12))...); delete it to start over")
        }
        return (state, meta)
    }

    public func delete() throws {
        if exists { try FileManager.default.removeItem(at: url) }
    }
}
