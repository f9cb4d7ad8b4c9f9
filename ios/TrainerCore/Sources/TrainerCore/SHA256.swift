import Foundation
#if canImport(CryptoKit)
import CryptoKit
#endif

/// SHA-256 (FIPS 180-4): CryptoKit's on Apple (hardware-accelerated; a ~290 MB weights file at import
/// takes seconds, not the minutes this Swift loop takes in a Debug build), this portable implementation
/// elsewhere (CryptoKit is not on Linux, where the host tests run it; `portableDigest`). The replay
/// checks hash every input the loop builds, and checkpoints can be identified by the state's hash.
public enum SHA256 {
    private static let k: [UInt32] = [
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2]

    public static func hex(_ data: Data) -> String { data.withUnsafeBytes { hex($0) } }

    public static func hex(_ bytes: UnsafeRawBufferPointer) -> String {
        digest(bytes).map { String(format: "%02x", $0) }.joined()
    }

    /// `progress`: called with the bytes hashed so far every 16 MiB (a multi-GB weights file shows it).
    public static func digest(_ bytes: UnsafeRawBufferPointer, progress: ((Int) -> Void)? = nil) -> [UInt8] {
        #if canImport(CryptoKit)
        var hasher = CryptoKit.SHA256()
        let chunk = 16 << 20
        var off = 0
        while off < bytes.count {
            let end = min(off + chunk, bytes.count)
            hasher.update(bufferPointer: UnsafeRawBufferPointer(rebasing: bytes[off..<end]))
            off = end
            if let progress, off % chunk == 0 { progress(off) }
        }
        return Array(hasher.finalize())
        #else
        return portableDigest(bytes, progress: progress)
        #endif
    }

    /// The Swift implementation (FIPS 180-4) `digest` uses where CryptoKit is not.
    public static func portableDigest(_ bytes: UnsafeRawBufferPointer, progress: ((Int) -> Void)? = nil) -> [UInt8] {
        var h: [UInt32] = [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19]
        var w = [UInt32](repeating: 0, count: 64)
        func rotr(_ x: UInt32, _ n: UInt32) -> UInt32 { (x >> n) | (x << (32 - n)) }
        func block(_ p: UnsafeRawPointer) {
            for i in 0..<16 { w[i] = UInt32(bigEndian: p.loadUnaligned(fromByteOffset: 4 * i, as: UInt32.self)) }
            for i in 16..<64 {
                let s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3)
                let s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10)
                w[i] = w[i - 16] &+ s0 &+ w[i - 7] &+ s1
            }
            var (a, b, c, d, e, f, g, hh) = (h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7])
            for i in 0..<64 {
                let s1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)
                let ch = (e & f) ^ (~e & g)
                let t1 = hh &+ s1 &+ ch &+ k[i] &+ w[i]
                let s0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)
                let maj = (a & b) ^ (a & c) ^ (b & c)
                let t2 = s0 &+ maj
                (hh, g, f, e, d, c, b, a) = (g, f, e, d &+ t1, c, b, a, t1 &+ t2)
            }
            h[0] &+= a; h[1] &+= b; h[2] &+= c; h[3] &+= d; h[4] &+= e; h[5] &+= f; h[6] &+= g; h[7] &+= hh
        }
        let n = bytes.count
        var off = 0
        if let base = bytes.baseAddress {
            while off + 64 <= n {
                block(base + off)
                off += 64
                if let progress, off & (16 << 20 - 1) == 0 { progress(off) }
            }
        }
        var tail = [UInt8](repeating: 0, count: 128)
        let rest = n - off
        if rest > 0 { for i in 0..<rest { tail[i] = bytes[off + i] } }
        tail[rest] = 0x80
        let total = rest + 1 + 8 <= 64 ? 64 : 128
        let bits = UInt64(n) * 8
        for i in 0..<8 { tail[total - 1 - i] = UInt8(truncatingIfNeeded: bits >> (8 * UInt64(i))) }
        tail.withUnsafeBytes { t in
            block(t.baseAddress!)
            if total == 128 { block(t.baseAddress! + 64) }
        }
        return h.flatMap { v in (0..<4).map { UInt8(truncatingIfNeeded: v >> (24 - 8 * UInt32($0))) } }
    }
}
