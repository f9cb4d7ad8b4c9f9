import Foundation

/// One JSONL training row (`shared_schemas/data_row.schema.json`). Labels follow Hugging Face:
/// the program shifts them (labels[t+1] is the target of position t); -100 marks no target.
public struct DataRow: Equatable {
    public static let ignoreIndex: Int64 = -100
    private static let keys: Set<String> = ["schema_version", "input_ids", "labels", "text"]

    public var inputIds: [Int64]
    /// nil: the labels are the input ids.
    public var labels: [Int64]?
    public var text: String?

    public init(inputIds: [Int64], labels: [Int64]? = nil, text: String? = nil) {
        (self.inputIds, self.labels, self.text) = (inputIds, labels, text)
    }

    /// Parse one row, checked against the schema (types, minimum lengths, unknown keys).
    public static func parse(_ line: Data, where place: String) throws -> DataRow {
        func fail(_ why: String) -> TrainerError { .badInput("\(place): \(why)") }
        guard let value = try? JSONValue.parse(line) else { throw fail("not valid JSON") }
        guard let obj = value.objectValue else { throw fail("a row must be a JSON object") }
        if let extra = Set(obj.keys).subtracting(keys).sorted().first { throw fail("unknown key '\(extra)'") }
        if let v = obj["schema_version"], v.intValue != 1 { throw fail("schema_version must be 1") }
        guard let ids = ints(obj["input_ids"]) else { throw fail("input_ids must be a list of integers") }
        guard ids.count >= 2 else { throw fail("input_ids needs at least 2 tokens, has \(ids.count)") }
        if let bad = ids.first(where: { $0 < 0 }) { throw fail("input_ids holds the negative id \(bad)") }
        var labels: [Int64]?
        if let raw = obj["labels"] {
            guard let l = ints(raw), l.count >= 2 else { throw fail("labels must be a list of at least 2 integers") }
            if let bad = l.first(where: { $0 < ignoreIndex }) { throw fail("label \(bad) is below -100") }
            labels = l
        }
        var text: String?
        if let raw = obj["text"] {
            guard let t = raw.stringValue else { throw fail("text must be a string") }
            text = t
        }
        return DataRow(inputIds: ids, labels: labels, text: text)
    }

    private static func ints(_ v: JSONValue?) -> [Int64]? {
        guard let a = v?.arrayValue else { return nil }
        let out = a.compactMap(\.intValue)
        return out.count == a.count ? out : nil
    }

    /// Rows of a JSONL file (blank lines skipped); errors name the line.
    public static func parseJSONL(_ data: Data, source: String = "data") throws -> [DataRow] {
        var rows: [DataRow] = []
        var lineNo = 0
        for line in data.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false) {
            lineNo += 1
            let trimmed = line.drop { $0 == UInt8(ascii: " ") || $0 == UInt8(ascii: "\r") || $0 == UInt8(ascii: "\t") }
            if trimmed.isEmpty { continue }
            rows.append(try parse(Data(line), where: "\(source):\(lineNo)"))
        }
        guard !rows.isEmpty else { throw TrainerError.badInput("\(source) has no rows; give a JSONL file of tokenized rows") }
        return rows
    }
}

/// A row padded to the program's sequence length (what `LayerLoop.trainStep` pads to).
public struct PaddedRow: Equatable {
    public var inputIds: [Int64]   // [seq_len], padded with the tokenizer's pad id
    public var labels: [Int64]     // [seq_len], padded with -100
    /// Labels that are not -100 (what the host runner reports as `tokens`).
    public var tokens: Int { labels.reduce(0) { $0 + ($1 == DataRow.ignoreIndex ? 0 : 1) } }
}

/// Checks rows against the program and pads them: ids < vocab, labels the same length as ids and
/// each a token id or -100, at least one target, and no row longer than seq_len (rows are never
/// cut: the host refuses them too, so both sides train on the same tokens).
public struct Batcher {
    public let seqLen: Int
    public let padTokenId: Int64
    public let vocab: Int64

    public init(manifest: Manifest) {
        seqLen = manifest.seqLen
        padTokenId = Int64(manifest.tokenizer?.padTokenId ?? 0)
        vocab = Int64(manifest.model.arch.vocab)
    }

    public init(seqLen: Int, padTokenId: Int64, vocab: Int64) {
        (self.seqLen, self.padTokenId, self.vocab) = (seqLen, padTokenId, vocab)
    }

    public func pad(_ row: DataRow, where place: String) throws -> PaddedRow {
        func fail(_ why: String) -> TrainerError { .badInput("\(place): \(why)") }
        let ids = row.inputIds
        let labels = row.labels ?? ids
        guard ids.count <= seqLen else {
            throw fail("row has \(ids.count) tokens; this program was exported for seq_len \(seqLen) (re-export with a longer --seq-len or shorten the rows)")
        }
        if let bad = ids.first(where: { $0 < 0 || $0 >= vocab }) {
            throw fail("token id \(bad) is out of range for a vocabulary of \(vocab)")
        }
        guard labels.count == ids.count else { throw fail("labels has \(labels.count) entries, input_ids has \(ids.count)") }
        if let bad = labels.first(where: { $0 >= vocab || ($0 < 0 && $0 != DataRow.ignoreIndex) }) {
            throw fail("label \(bad) is neither a token id < \(vocab) nor -100")
        }
        guard labels.dropFirst().contains(where: { $0 != DataRow.ignoreIndex }) else {
            throw fail("row has no token to predict (every label after the first is -100)")
        }
        let pad = seqLen - ids.count
        return PaddedRow(inputIds: ids + Array(repeating: padTokenId, count: pad),
                             labels: labels + Array(repeating: DataRow.ignoreIndex, count: pad))
    }

    public func padAll(_ rows: [DataRow], source: String = "data") throws -> [PaddedRow] {
        try rows.enumerated().map { try pad($1, where: "\(source): row \($0 + 1)") }
    }
}

/// Which row each step trains on, as the host (`toolchain/training/order.py`): file order, cycling;
/// with a seed, the rows of epoch e (pass e over the data) are `Shuffle.permutation(rows, seed + e)`
/// (mod 2^64), so a seeded run visits the same rows on the host and on the phone, and a resumed run
/// the rows an uninterrupted one would.
public struct DataOrder {
    public let rowCount: Int
    public let seed: UInt64?

    public init(rowCount: Int, seed: UInt64?) {
        precondition(rowCount > 0, "DataOrder needs at least one row")
        (self.rowCount, self.seed) = (rowCount, seed)
    }

    /// A signed seed (the host's `--shuffle -1`) taken modulo 2^64.
    public init(rowCount: Int, signedSeed: Int64?) {
        self.init(rowCount: rowCount, seed: signedSeed.map { UInt64(bitPattern: $0) })
    }

    public func row(forStep step: Int) -> Int {
        guard seed != nil else { return step % rowCount }
        return permutation(epoch: step / rowCount)[step % rowCount]
    }

    public func permutation(epoch: Int) -> [Int] {
        guard let seed else { return Array(0..<rowCount) }
        return Shuffle.permutation(rowCount, seed: seed &+ UInt64(epoch))
    }
}

/// SplitMix64 (Steele, Lea, Flood 2014): a tiny seeded generator, identical on every platform.
public struct SplitMix64: RandomNumberGenerator {
    public var state: UInt64
    public init(state: UInt64) { self.state = state }
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
