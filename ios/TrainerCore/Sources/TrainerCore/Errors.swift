import Foundation

/// Everything TrainerCore throws. Each message names the problem and the way out, like the host's
/// `toolchain.errors` (the app shows `description` as is).
public enum TrainerError: Error, Equatable, CustomStringConvertible {
    /// A manifest, step plan, data row or checkpoint that breaks its schema or the program.
    case badInput(String)
    /// The runtime (ExecuTorch, Core ML) failed or did something the contract forbids.
    case runtime(String)
    /// A file could not be read or written.
    case io(String)

    public var description: String {
        switch self {
        case .badInput(let m), .runtime(let m), .io(let m): return m
        }
    }
}

/// Thrown by tests' and apps' helpers for a missing file, with the path in the message.
func readFile(_ url: URL, what: String) throws -> Data {
    do {
        return try Data(contentsOf: url)
    } catch {
        throw TrainerError.io("cannot read \(what) \(url.path): \(error.localizedDescription)")
    }
}
