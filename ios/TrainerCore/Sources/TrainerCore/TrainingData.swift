import Foundation

/// The user's data as rows for a program: text or chat JSONL -> rows (`TextRows`), checked against
/// the program (`Batcher`), and the seeded held-out split (`TextRows.splitHeldOut`).
public struct TrainingData: Equatable {
    public var train: [DataRow]
    public var heldOut: [DataRow]
    /// Target tokens (labels after the shift that are not -100) of the training rows.
    public var trainTokens: Int { train.reduce(0) { $0 + TrainingData.targets($1) } }

    public init(train: [DataRow], heldOut: [DataRow]) { (self.train, self.heldOut) = (train, heldOut) }

    public enum Source: Equatable {
        case text(String)
        /// JSONL, one `{"messages": [...]}` per line; `name` is used in error messages.
        case chat(String, name: String)
    }

    /// Rows of `source` for the program, `heldOutFraction` of them held out (0: none) with `seed`.
    public static func prepare(_ source: Source, tokenizer: ProgramTokenizer, manifest: Manifest,
                               heldOutFraction: Double, seed: UInt64) throws -> TrainingData {
        let rows: [DataRow]
        switch source {
        case .text(let t): rows = try TextRows.dataRows(text: t, tokenizer: tokenizer, seqLen: manifest.seqLen)
        case .chat(let t, let name): rows = try TextRows.chatRows(t, tokenizer: tokenizer.base, seqLen: manifest.seqLen, source: name)
        }
        let batcher = Batcher(seqLen: manifest.seqLen, padTokenId: Int64(tokenizer.padId), vocab: Int64(manifest.model.arch.vocab))
        for (i, r) in rows.enumerated() { _ = try batcher.pad(r, where: "row \(i + 1)") }
        guard heldOutFraction > 0 else { return TrainingData(train: rows, heldOut: []) }
        let (train, held) = try TextRows.splitHeldOut(rows, fraction: heldOutFraction, seed: seed)
        return TrainingData(train: train, heldOut: held)
    }

    static func targets(_ r: DataRow) -> Int { (r.labels ?? r.inputIds).dropFirst().filter { $0 != DataRow.ignoreIndex }.count }
}
