"""ios/typecheck/swift_api.py: the ExecuTorch Swift API listing read from ExecuTorch's sources (the Objective-C headers as
Swift imports them, the Swift overlay) and the check of the stand-ins in ios/typecheck/ExecuTorch.swift against it. The
import rules are checked on header snippets with known Swift names (from the headers' own documentation and the app's
use), and the check must fail on a stand-in member, type, label, `throws` or overlay type that the listing lacks."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("swift_api", REPO / "ios" / "typecheck" / "swift_api.py")
swift_api = importlib.util.module_from_spec(spec)
spec.loader.exec_module(swift_api)

HEADER = """
typedef NS_ENUM(NSInteger, ExecuTorchModuleLoadMode) {
  ExecuTorchModuleLoadModeFile = 0,
  ExecuTorchModuleLoadModeMmapUseMlock,
} NS_SWIFT_NAME(ModuleLoadMode);
typedef NS_ENUM(int8_t, ExecuTorchDataType) { ExecuTorchDataTypeUInt16, ExecuTorchDataTypeQInt8 } NS_SWIFT_NAME(DataType);
NS_SWIFT_NAME(LogSink)
@protocol ExecuTorchLogSink
- (void)logWithLevel:(NSInteger)level message:(NSString *)message NS_SWIFT_NAME(log(level:message:));
@end
NS_SWIFT_NAME(Log)
__attribute__((objc_subclassing_restricted))
@interface ExecuTorchLog : NSObject
@property(class, readonly) ExecuTorchLog *sharedLog;
+ (instancetype)new NS_UNAVAILABLE;
@end
NS_SWIFT_NAME(Module)
@interface ExecuTorchModule : NSObject
- (instancetype)initWithFilePath:(NSString *)filePath
                        loadMode:(ExecuTorchModuleLoadMode)loadMode;
- (BOOL)load:(NSError **)error;
- (BOOL)isLoaded;
- (BOOL)loadMethod:(NSString *)methodName
             error:(NSError **)error NS_SWIFT_NAME(load(_:));
- (nullable NSSet<NSString *> *)methodNames:(NSError **)error
    NS_RETURNS_RETAINED;
- (nullable NSArray *)executeMethod:(NSString *)methodName withInputs:(NSArray *)values error:(NSError **)error
    NS_REFINED_FOR_SWIFT;
- (BOOL)setInput:(id)value error:(NSError **)error NS_SWIFT_UNAVAILABLE("");
@end
"""

OVERLAY = """
@_exported import ExecuTorch
public protocol Scalar {
  static var dataType: DataType { get }
}
extension Float: Scalar {
  public static var dataType: DataType { .float }
}
public final class Tensor<T: Scalar>: Equatable {
  public let anyTensor: AnyTensor
  public convenience init(
    bytesNoCopy pointer: UnsafeMutableRawPointer,
    shape: [Int],
    strides: [Int] = []
  ) {
    self.init(AnyTensor())
  }
  public convenience init(_ scalars: inout [T], shape: [Int] = []) { fatalError() }
  func hidden() {}
  public func withUnsafeBytes<R>(_ body: (UnsafeBufferPointer<T>) throws -> R) rethrows -> R { fatalError() }
}
public extension Module {
  func execute(_ method: String, _ inputs: [ValueConvertible]) throws -> [Value] { [] }
}
"""


def listing():
    return {"source": {"commit": "0" * 40},
            "api": swift_api.merge([swift_api.objc_declarations(HEADER), swift_api.swift_declarations(OVERLAY)])}


def test_objective_c_import_rules():
    api = listing()["api"]
    assert api["types"] == {"DataType": "enum", "Log": "class", "LogSink": "protocol", "Module": "class",
                            "ModuleLoadMode": "enum", "Scalar": "protocol", "Tensor": "class"}
    assert api["members"]["Module"] == ["func execute(_:_:) throws [(String, [ValueConvertible]) -> [Value]]",
                                        "func isLoaded()", "func load() throws", "func load(_:) throws",
                                        "func methodNames() throws", "init init(filePath:loadMode:)"]
    assert api["members"]["ModuleLoadMode"] == ["case file", "case mmapUseMlock"]
    assert api["members"]["DataType"] == ["case qInt8", "case uInt16"]
    assert api["members"]["Log"] == ["static var shared"]                     # sharedLog of Log
    assert api["members"]["LogSink"] == ["func log(level:message:)"]
    assert {"ModuleLoadMode: Int", "DataType: Int8", "LogSink: AnyObject", "Float: Scalar", "Tensor: Equatable"} <= set(api["conformances"])


def test_overlay_declarations():
    tensor = listing()["api"]["members"]["Tensor"]
    assert "init init(bytesNoCopy:shape:strides:) [(UnsafeMutableRawPointer, [Int], [Int]=)]" in tensor
    assert "init init(_:shape:) [(inout[T], [Int]=)]" in tensor
    assert "var anyTensor: AnyTensor" in tensor
    assert not any("hidden" in m for m in tensor)                            # not public


def check(standin: str) -> list[str]:
    return swift_api.check(listing(), swift_api.swift_declarations(standin))


GOOD = """
public enum ModuleLoadMode: Int { case file = 0, mmapUseMlock }
public protocol LogSink: AnyObject { func log(level: Int, message: String) }
public final class Log { public static var shared: Log { fatalError() } }
public class Module {
  public init(filePath: String, loadMode: ModuleLoadMode) {}
  public func load() throws {}
  public func load(_ methodName: String) throws {}
  public func isLoaded() -> Bool { false }
  public func execute(_ method: String, _ inputs: [ValueConvertible]) throws -> [Value] { [] }
}
public final class Tensor<T: Scalar> {
  public convenience init(bytesNoCopy pointer: UnsafeMutableRawPointer, shape: [Int], strides: [Int] = []) { fatalError() }
}
extension Float: Scalar { public static var dataType: DataType { .float } }
"""


def test_a_faithful_stand_in_passes():
    assert check(GOOD) == []


def test_what_the_listing_lacks_fails():
    cases = {
        "public func loadMethod(_ name: String) throws {}": "`func loadMethod(_:) throws` is not in the listing",
        "public func load(method: String) throws {}": "`func load(method:) throws` is not in the listing",      # label
        "public func methodNames() -> Set<String> { [] }": "`func methodNames()` is not in the listing",       # throws
        "public var rawDataBuffer: Int { 0 }": "`var rawDataBuffer: Int` is not in the listing",
    }
    for decl, want in cases.items():
        problems = check(GOOD.replace("public func isLoaded() -> Bool { false }", decl))
        assert any(want in p for p in problems), (decl, problems)
    # an overlay member with another parameter type
    problems = check(GOOD.replace("strides: [Int] = []) { fatalError() }", "strides: [Int]) { fatalError() }"))
    assert any("takes [(UnsafeMutableRawPointer,[Int],[Int])]" in p.replace(", ", ",") for p in problems), problems
    assert check(GOOD + "public struct Extra {}\n") == ["type Extra is not in the listing"]
    assert check(GOOD.replace("public class Module", "public struct Module")) [0] == \
        "type Module is a struct in the stand-in, a class in the listing"
    assert check(GOOD + "extension Int8: Scalar { public static var dataType: DataType { .char } }\n") == \
        ["conformance Int8: Scalar is not in the listing"]


def test_recorded_listing_and_the_repository_stand_in():
    """The committed listing (ExecuTorch's sources) has the calls the app makes, and the stand-in passes against it."""
    recorded = json.loads((REPO / "ios/typecheck/executorch-swift.json").read_text())
    m = recorded["api"]["members"]
    assert {"func load(_:) throws", "init init(filePath:loadMode:)", "func methodMetadata(_:) throws"} <= set(m["Module"])
    assert "static var shared" in m["Log"]
    standin = swift_api.swift_declarations((REPO / "ios/typecheck/ExecuTorch.swift").read_text())
    assert swift_api.check(recorded, standin) == []
