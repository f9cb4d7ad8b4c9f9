import XCTest
@testable import TrainerCore

/// The on-screen line of the native kernels (`KernelPath.describe`) for every probe outcome, as trainer-core's KernelPathTest.
final class KernelPathTests: XCTestCase {
    func testEveryNamedPathIsShown() {
        for p in KernelPath.names { XCTAssertEqual(KernelPath.describe(registered: true, path: p), "native kernels: yes (path \(p))") }
    }

    func testStockMethodsWhateverThePathSays() {
        XCTAssertEqual(KernelPath.describe(registered: false, path: nil), "native kernels: no (stock methods)")
        XCTAssertEqual(KernelPath.describe(registered: false, path: "neon"), "native kernels: no (stock methods)")
    }

    func testOlderKernelsOrRefusedPathIsUnknown() {
        XCTAssertEqual(KernelPath.describe(registered: true, path: nil), "native kernels: yes (path unknown)")
        XCTAssertEqual(KernelPath.describe(registered: true, path: ""), "native kernels: yes (path unknown)")
        XCTAssertEqual(KernelPath.describe(registered: true, path: "neon; rm -rf"), "native kernels: yes (path unknown)")
        XCTAssertEqual(KernelPath.describe(registered: true, path: String(repeating: "x", count: 33)), "native kernels: yes (path unknown)")
        XCTAssertEqual(KernelPath.describe(registered: true, path: "sve2"), "native kernels: yes (path sve2)")
    }
}
