import Foundation

/// What the screen says about the native kernels (toolchain/native/kernels.cpp, compiled into the app target):
/// whether generation runs them, and which of their run-time paths this CPU got. Pure, so the host tests every case;
/// the app feeds it its probe's answers (the ExecuTorch kernel registry, `ToolchainKernels.h`, and
/// `toolchain_kernel_path()` through the same file). As trainer-core's KernelPath (Android), word for word.
public enum KernelPath {
    /// The names toolchain_kernel_path() returns (x86: generic, avx2, avx_vnni, avx512_vnni; arm64: generic, neon, dotprod, i8mm).
    public static let names = ["generic", "avx2", "avx_vnni", "avx512_vnni", "neon", "dotprod", "i8mm"]

    /// The line for a Core ML run (the native kernels are ExecuTorch kernels).
    public static let coreML = "native kernels: no (Core ML runs the program)"

    /// `registered`: the runtime has every kernel of the fused methods (the fused generation methods run). `path`:
    /// what `toolchain_kernel_path()` returned; nil when the kernels predate it or it named no path (a forced path
    /// refused). A name outside `names` (a newer kernels.cpp) is shown only if it is a plain identifier.
    public static func describe(registered: Bool, path: String?) -> String {
        guard registered else { return "native kernels: no (stock methods)" }
        guard let path, isPlain(path) else { return "native kernels: yes (path unknown)" }
        return "native kernels: yes (path \(path))"
    }

    private static func isPlain(_ s: String) -> Bool {
        (1...32).contains(s.utf8.count) && s.utf8.allSatisfy { (0x61...0x7a).contains($0) || (0x30...0x39).contains($0) || $0 == 0x5f }
    }
}
