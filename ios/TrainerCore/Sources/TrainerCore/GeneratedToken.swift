import Foundation

/// One token of a streaming generation: its index in the generation, its id and the text it
/// completed (`IncrementalTextDecoder`: "" while a character is still incomplete, never a broken
/// one; the texts of a generation's tokens concatenate to its `Generation.text`, but for an
/// incomplete character at the very end, which only the final text shows, as U+FFFD).
public struct GeneratedToken: Equatable {
    public var initial: Bool
    public var index: Int
    public var id: Int64
    public var text: String
}
