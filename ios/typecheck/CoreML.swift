// Stand-in for the part of Apple's Core ML API the app uses (iOS 17 SDK declarations as Swift sees
// them: MLModel, MLModelConfiguration, MLModelDescription, MLFeatureDescription,
// MLMultiArrayConstraint, MLFeatureValue, MLFeatureProvider, MLDictionaryFeatureProvider,
// MLMultiArray, MLMultiArrayDataType incl. the iOS 26 `int8`, MLComputeUnits). Written from Apple's documentation, not
// from the SDK: only for type-checking ios/App/Sources/Runtime/CoreMLRuntime.swift on Linux
// (ios/test.sh). Bodies are placeholders.
import Foundation

public enum MLComputeUnits: Int { case cpuOnly = 0, cpuAndGPU = 1, all = 2, cpuAndNeuralEngine = 3 }

public enum MLMultiArrayDataType: Int {
    case double = 65600, float32 = 65568, float16 = 65552, int32 = 131104
    // MLMultiArrayDataTypeInt8 = 0x20000 | 8 (iOS 26 / macOS 26 SDKs)
    @available(iOS 26, macOS 26, *) case int8 = 131080
}

public class MLModelConfiguration {
    public init() {}
    public var computeUnits: MLComputeUnits = .all
}

public class MLMultiArrayConstraint {
    public var shape: [NSNumber] { [] }
    public var dataType: MLMultiArrayDataType { .float32 }
}

public class MLFeatureDescription {
    public var name: String { "" }
    public var multiArrayConstraint: MLMultiArrayConstraint? { nil }
}

public class MLModelDescription {
    public var inputDescriptionsByName: [String: MLFeatureDescription] { [:] }
    public var outputDescriptionsByName: [String: MLFeatureDescription] { [:] }
}

public class MLMultiArray {
    public init(shape: [NSNumber], dataType: MLMultiArrayDataType) throws {}
    // init(dataPointer:shape:dataType:strides:deallocator:) (MLMultiArray.h, iOS 11+): wraps memory
    // without copying; `deallocator` is called when the array is freed (nil: the caller owns it).
    public init(dataPointer: UnsafeMutableRawPointer, shape: [NSNumber], dataType: MLMultiArrayDataType, strides: [NSNumber],
                deallocator: ((UnsafeMutableRawPointer) -> Void)? = nil) throws {}
    public var count: Int { 0 }
    public var shape: [NSNumber] { [] }
    public var strides: [NSNumber] { [] }
    public var dataType: MLMultiArrayDataType { .float32 }
    public subscript(index: Int) -> NSNumber { get { 0 } set {} }
    public func withUnsafeBytes<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R { fatalError() }
    public func withUnsafeMutableBytes<R>(_ body: (UnsafeMutableRawBufferPointer, [Int]) throws -> R) rethrows -> R { fatalError() }
}

public class MLFeatureValue {
    public init(multiArray value: MLMultiArray) {}
    public var multiArrayValue: MLMultiArray? { nil }
}

public protocol MLFeatureProvider {
    var featureNames: Set<String> { get }
    func featureValue(for featureName: String) -> MLFeatureValue?
}

public class MLDictionaryFeatureProvider: MLFeatureProvider {
    public init(dictionary: [String: Any]) throws {}
    public var featureNames: Set<String> { [] }
    public func featureValue(for featureName: String) -> MLFeatureValue? { nil }
}

public class MLModel {
    public init(contentsOf url: URL, configuration: MLModelConfiguration) throws {}
    public var modelDescription: MLModelDescription { MLModelDescription() }
    public func prediction(from input: MLFeatureProvider) throws -> MLFeatureProvider { input }
    public class func compileModel(at modelURL: URL) async throws -> URL { modelURL }
}
