import Foundation

/// The run the app resumes after it was killed (jetsam, reboot, swipe): settings and the name of its
/// rows file (the prepared rows, beside it: the user's text may be gone), in `AppPaths.latestRun`,
/// written atomically when a run starts and marked finished when it completes; with the program's
/// checkpoint it is all a resume needs.
public struct SavedRun: Codable, Equatable {
    public var program: String
    public var backend: String
    public var config: SessionConfig
    public var budgetMB: Int
    public var source: String
    public var heldOutFraction: Double
    public var splitSeed: UInt64
    /// The run's rows: a binary file (`RowsFile`) beside the saved run's JSON, by name. The JSON stays a few
    /// hundred bytes whatever the text (a 32 MB text is ~100 MB of rows as JSON: seconds of coding, a
    /// watchdog kill at launch when done on the main thread); the rows are written and read off the main
    /// thread only (`RowsFile.write`, `rows(besides:)`).
    public var rowsFile: String
    public var trainRows: Int
    public var heldOutRows: Int
    public var status: RunStatus?
    public var runId: String?

    public init(program: String, backend: String, config: SessionConfig, budgetMB: Int, source: String,
                heldOutFraction: Double, splitSeed: UInt64, rowsFile: String, trainRows: Int, heldOutRows: Int) {
        (self.program, self.backend, self.config, self.budgetMB, self.source) = (program, backend, config, budgetMB, source)
        (self.heldOutFraction, self.splitSeed) = (heldOutFraction, splitSeed)
        (self.rowsFile, self.trainRows, self.heldOutRows) = (rowsFile, trainRows, heldOutRows)
    }

    /// A new rows file name (one per run: a new run never overwrites the rows a saved run points at).
    public static func newRowsFile() -> String { "rows-\(UUID().uuidString.lowercased()).bin" }

    /// The rows file's location when the saved run's JSON is at `json`.
    public func rowsURL(besides json: URL) -> URL { json.deletingLastPathComponent().appendingPathComponent(rowsFile) }

    /// The run's rows, read from its rows file (off the main thread), checked against the counts saved.
    public func rows(besides json: URL) throws -> TrainingData {
        let d = try RowsFile.read(rowsURL(besides: json))
        guard d.train.count == trainRows, d.heldOut.count == heldOutRows else {
            throw TrainerError.badInput("\(rowsFile) has \(d.train.count) + \(d.heldOut.count) rows, the saved run \(trainRows) + \(heldOutRows); prepare the text again")
        }
        return d
    }

    /// Unfinished: a resume continues it.
    public var resumable: Bool { status == nil || status == .paused }

    /// The JSON only (no rows: see `rowsFile`).
    public func save(to url: URL) throws {
        let e = JSONEncoder()
        e.outputFormatting = [.sortedKeys]
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        try AtomicFiles.write(try e.encode(self), to: url)
    }

    public static func load(from url: URL) -> SavedRun? {
        guard let d = try? Data(contentsOf: url) else { return nil }
        return try? JSONDecoder().decode(SavedRun.self, from: d)
    }
}

/// A run's rows as a binary file: "TRROWS01", u32 train count, u32 held-out count, then per row (train
/// rows first) u32 n, u8 has-labels, n int32 input ids, and n int32 labels when it has them; little-endian.
/// Written atomically. Coding it is a copy of the ids (no text parsing), done off the main thread.
public enum RowsFile {
    static let magic = Array("TRROWS01".utf8)

    public static func encode(_ data: TrainingData) throws -> Data {
        var out = Data()
        out.reserveCapacity(16 + (data.train + data.heldOut).reduce(0) { $0 + 5 + 4 * $1.inputIds.count * ($1.labels == nil ? 1 : 2) })
        out.append(contentsOf: magic)
        func u32(_ v: Int) { var x = UInt32(v).littleEndian; withUnsafeBytes(of: &x) { out.append(contentsOf: $0) } }
        func ids(_ a: [Int64]) throws {
            var v = try a.map { (x: Int64) -> Int32 in
                guard let y = Int32(exactly: x) else { throw TrainerError.badInput("token id \(x) does not fit a rows file") }
                return y.littleEndian
            }
            v.withUnsafeMutableBytes { out.append(contentsOf: $0) }
        }
        u32(data.train.count)
        u32(data.heldOut.count)
        for r in data.train + data.heldOut {
            u32(r.inputIds.count)
            out.append(r.labels == nil ? 0 : 1)
            try ids(r.inputIds)
            if let l = r.labels {
                guard l.count == r.inputIds.count else { throw TrainerError.badInput("a row's labels (\(l.count)) and ids (\(r.inputIds.count)) differ in length") }
                try ids(l)
            }
        }
        return out
    }

    public static func decode(_ d: Data, name: String = "rows file") throws -> TrainingData {
        try d.withUnsafeBytes { (raw: UnsafeRawBufferPointer) -> TrainingData in
            var at = 0
            func bad(_ why: String) -> Error { TrainerError.badInput("\(name) is damaged (\(why)); prepare the text again") }
            func need(_ n: Int) throws { if n < 0 || at + n > raw.count { throw bad("truncated at byte \(at)") } }
            func u32() throws -> Int { try need(4); defer { at += 4 }; return Int(UInt32(littleEndian: raw.loadUnaligned(fromByteOffset: at, as: UInt32.self))) }
            func ids(_ n: Int) throws -> [Int64] {
                try need(4 * n)
                var out = [Int64](repeating: 0, count: n)
                for i in 0..<n { out[i] = Int64(Int32(littleEndian: raw.loadUnaligned(fromByteOffset: at + 4 * i, as: Int32.self))) }
                at += 4 * n
                return out
            }
            try need(8)
            guard Array(raw[0..<8]) == magic else { throw bad("not a rows file") }
            at = 8
            let (nTrain, nHeld) = (try u32(), try u32())
            var rows: [DataRow] = []
            rows.reserveCapacity(min(nTrain + nHeld, raw.count / 5))
            for _ in 0..<(nTrain + nHeld) {
                let n = try u32()
                try need(1)
                let flag = raw[at]
                at += 1
                guard flag <= 1 else { throw bad("bad row flag \(flag)") }
                let input = try ids(n)
                var labels: [Int64]?
                if flag == 1 { labels = try ids(n) }
                rows.append(DataRow(inputIds: input, labels: labels))
            }
            guard at == raw.count else { throw bad("\(raw.count - at) bytes after the last row") }
            return TrainingData(train: Array(rows[0..<nTrain]), heldOut: Array(rows[nTrain...]))
        }
    }

    public static func write(_ data: TrainingData, to url: URL) throws {
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        try AtomicFiles.write(try encode(data), to: url)
    }

    public static func read(_ url: URL) throws -> TrainingData {
        try decode(try Data(contentsOf: url, options: .mappedIfSafe), name: url.lastPathComponent)
    }
}
