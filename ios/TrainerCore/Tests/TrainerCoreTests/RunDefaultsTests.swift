import Foundation
import XCTest
@testable import TrainerCore

/// A run's lr and steps when the user gives none (issue 42 item 3): the manifest's `defaults` (what `toolchain export`
/// measured and recorded, toolchain/export/app_defaults.py), else an older program's optimizer.default_lr and
/// `Contract.fallbackSteps`; what the user asks for wins. The same rules as trainer-core's RunDefaultsTest.
final class RunDefaultsTests: XCTestCase {
    private func manifest(defaults: Any?, dropDefaultLr: Bool = false) throws -> Manifest {
        var obj = try JSONSerialization.jsonObject(with: try Repo.data(Repo.manifest("manifest_tiny.json"))) as! [String: Any]
        XCTAssertNil(obj["defaults"], "the example is a library export: no defaults")
        if let d = defaults { obj["defaults"] = d }
        if dropDefaultLr, var opt = obj["optimizer"] as? [String: Any] { opt["default_lr"] = nil; obj["optimizer"] = opt }
        return try Manifest.decode(try JSONSerialization.data(withJSONObject: obj), source: "manifest.json")
    }

    func testTheManifestsDefaultsAreARunsLrAndStepsUnlessTheUserAsks() throws {
        let m = try manifest(defaults: ["lr": 0.1, "steps": 400])
        let resolved = SessionConfig(steps: 0, lr: 0).resolvingDefaults(m)
        XCTAssertEqual(resolved.steps, 400)
        XCTAssertEqual(resolved.lr, 0.1)
        let asked = SessionConfig(steps: 25, lr: 0.003).resolvingDefaults(m)
        XCTAssertEqual(asked.steps, 25)
        XCTAssertEqual(asked.lr, 0.003)
        XCTAssertEqual(SessionConfig(steps: 10, lr: 0).resolvingLr(m).lr, 0.1, "defaults.lr before optimizer.default_lr")
    }

    func testAnOlderProgramFallsBackToOptimizerDefaultLrAndOneHundredSteps() throws {
        let old = try manifest(defaults: nil)
        let lr = try XCTUnwrap(old.optimizer.defaultLr)
        let c = SessionConfig(steps: 0, lr: 0).resolvingDefaults(old)
        XCTAssertEqual(c.steps, Contract.fallbackSteps)
        XCTAssertEqual(c.lr, Float(lr))
        XCTAssertEqual(Contract.fallbackSteps, 100)
        XCTAssertEqual(SessionConfig(steps: 0, lr: 0).resolvingDefaults(try manifest(defaults: nil, dropDefaultLr: true)).lr,
                       Float(Contract.fallbackLr))
    }

    func testBadDefaultsAreAManifestError() throws {
        for bad: Any in [["lr": 0, "steps": 10], ["lr": 0.1, "steps": 0], ["lr": 0.1], ["steps": 3], ["lr": "x", "steps": 3]] {
            XCTAssertThrowsError(try manifest(defaults: bad), "\(bad)")
        }
    }
}
