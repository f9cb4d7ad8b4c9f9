// Stand-in for the part of the ExecuTorch Swift API the app uses, with the same declarations as
// executorch 1.4.1 / 1.5 (pytorch/executorch extension/apple/ExecuTorch/Exported/: ExecuTorchModule.h
// and ExecuTorch+Module.swift, ExecuTorch+Tensor.swift, ExecuTorch+Value.swift; the Objective-C
// methods as Swift imports them, e.g. `loadMethod:error:` NS_SWIFT_NAME(load(_:)) -> `load(_:) throws`).
// Only for type-checking ios/App/Sources/Runtime/ExecuTorchRuntime.swift (the layer loop's runtime) on Linux (ios/test.sh); the
// app links the real package. Bodies are placeholders.

import Foundation

public enum DataType { case float, long, byte, char }

// ExecuTorchLog.h: NS_ENUM(NSInteger, ExecuTorchLogLevel) NS_SWIFT_NAME(LogLevel) ('D', 'I', 'E', 'F', '?'),
// @protocol ExecuTorchLogSink NS_SWIFT_NAME(LogSink) with
// logWithLevel:timestamp:filename:line:message: NS_SWIFT_NAME(log(level:timestamp:filename:line:message:)),
// @interface ExecuTorchLog NS_SWIFT_NAME(Log) with +sharedLog (Swift: Log.shared), addSink: NS_SWIFT_NAME(add(sink:)).
// (The real protocol is @objc: conforming classes are NSObject subclasses, as the app's is.)
public enum LogLevel: Int { case debug = 68, info = 73, error = 69, fatal = 70, unknown = 63 }

public protocol LogSink: AnyObject {
    func log(level: LogLevel, timestamp: TimeInterval, filename: String, line: UInt, message: String)
}

public final class Log {
    public static var shared: Log { fatalError() }
    public func add(sink: LogSink) {}
    public func remove(sink: LogSink) {}
}

public protocol Scalar { static var dataType: DataType { get } }
extension Float: Scalar { public static var dataType: DataType { .float } }
extension Int64: Scalar { public static var dataType: DataType { .long } }
// ExecuTorch+Tensor.swift: `extension UInt8: Scalar` (.byte), `extension Int8: Scalar` (.char)
extension UInt8: Scalar { public static var dataType: DataType { .byte } }
extension Int8: Scalar { public static var dataType: DataType { .char } }

public enum ShapeDynamism { case `static`, dynamicBound, dynamicUnbound }

public class AnyTensor {
    public var dataType: DataType { .float }
    public func asTensor<T: Scalar>() -> Tensor<T>? { nil }
}

public final class Tensor<T: Scalar> {
    public let anyTensor = AnyTensor()
    public var shape: [Int] { [] }
    public var count: Int { 0 }
    public init(_ tensor: AnyTensor) {}
    public convenience init(bytes pointer: UnsafeRawPointer, shape: [Int], strides: [Int] = [], dimensionOrder: [Int] = [],
                            shapeDynamism: ShapeDynamism = .dynamicBound) { self.init(AnyTensor()) }
    public convenience init(bytesNoCopy pointer: UnsafeMutableRawPointer, shape: [Int], strides: [Int] = [],
                            dimensionOrder: [Int] = [], shapeDynamism: ShapeDynamism = .dynamicBound) { self.init(AnyTensor()) }
    public convenience init(_ scalars: [T], shape: [Int] = [], strides: [Int] = [], dimensionOrder: [Int] = [],
                            shapeDynamism: ShapeDynamism = .dynamicBound) { self.init(AnyTensor()) }
    public func withUnsafeBytes<R>(_ body: (UnsafeBufferPointer<T>) throws -> R) rethrows -> R { fatalError() }
}

public extension Tensor {
    func scalars() -> [T] { [] }
}

public class Value {
    public init(_ tensor: AnyTensor) {}
    public var anyTensor: AnyTensor? { nil }
    public func tensor<T: Scalar>() -> Tensor<T>? { anyTensor?.asTensor() }
}

public protocol ValueConvertible { func asValue() -> Value }
extension Value: ValueConvertible { public func asValue() -> Value { self } }
extension AnyTensor: ValueConvertible { public func asValue() -> Value { Value(self) } }
extension Tensor: ValueConvertible { public func asValue() -> Value { Value(anyTensor) } }

public enum ValueTag: UInt32 { case none, tensor, string, double, integer, boolean }

public final class MethodMetadata {
    public var name: String { "" }
    public var inputValueTags: [ValueTag] { [] }
    public var outputValueTags: [ValueTag] { [] }
}

public enum ModuleLoadMode: Int { case file = 0, mmap, mmapUseMlock, mmapUseMlockIgnoreErrors }

public class Module {
    public init(filePath: String, loadMode: ModuleLoadMode) {}
    public convenience init(filePath: String) { self.init(filePath: filePath, loadMode: .file) }
    public func load() throws {}
    public func isLoaded() -> Bool { false }
    public func load(_ methodName: String) throws {}
    public func isLoaded(_ methodName: String) -> Bool { false }
    public func unload(_ methodName: String) -> Bool { false }
    public func methodNames() throws -> Set<String> { [] }
    public func methodMetadata(_ methodName: String) throws -> MethodMetadata { MethodMetadata() }
    public func execute(_ method: String, _ inputs: [ValueConvertible]) throws -> [Value] { [] }
    public func execute(_ method: String, _ inputs: ValueConvertible...) throws -> [Value] { [] }
}
