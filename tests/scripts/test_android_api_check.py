"""android/api/api_check.py, the check of the Android host stubs and the app glue against the ExecuTorch API listing
recorded from ExecuTorch's sources (android/api/executorch-android.json): it must fail on a stub or a call that the
listing does not have (a property where ExecuTorch has a function, a Java class where it ships Kotlin, a static call
of an instance method, a write to a final field) and pass on what the listing has, including members inherited from
the JDK. The end-to-end cases compile small classes with javac and read them with javap, as android/test.sh does."""

from __future__ import annotations

import copy
import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("api_check", REPO / "android" / "api" / "api_check.py")
api_check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(api_check)

LISTING = {
    "source": {"commit": "0" * 40},
    "classes": {
        "org.pytorch.executorch.Tensor": {
            "language": "kotlin", "kind": "abstract class", "supertypes": [],
            "declarations": ["open fun getRawDataBuffer(): java.nio.Buffer", "open val dataAsFloatArray: kotlin.FloatArray",
                             "companion @JvmStatic fun fromBlob(data: java.nio.FloatBuffer, shape: kotlin.LongArray): org.pytorch.executorch.Tensor"],
            "jvm": ["getRawDataBuffer()Ljava/nio/Buffer;", "getDataAsFloatArray()[F",
                    "static fromBlob(Ljava/nio/FloatBuffer;[J)Lorg/pytorch/executorch/Tensor;",
                    "Companion.fromBlob(Ljava/nio/FloatBuffer;[J)Lorg/pytorch/executorch/Tensor;",
                    "protected final field shape:[J", "static final field Companion:Lorg/pytorch/executorch/Tensor$Companion;"],
        },
        "org.pytorch.executorch.ExecutorchRuntimeException": {
            "language": "kotlin", "kind": "open class", "supertypes": ["java.lang.RuntimeException"],
            "declarations": ["constructor(errorCode: kotlin.Int, details: kotlin.String?)", "val errorCode: kotlin.Int"],
            "jvm": ["<init>(ILjava/lang/String;)V", "getErrorCode()I"],
        },
        "org.pytorch.executorch.EValue": {
            "language": "kotlin", "kind": "class", "supertypes": [],
            "declarations": ["@JvmField val mTypeCode: kotlin.Int", "@JvmField var mData: kotlin.Any?"],
            "jvm": ["final field mTypeCode:I", "field mData:Ljava/lang/Object;"],
        },
        "org.pytorch.executorch.DType": {
            "language": "kotlin", "kind": "enum class", "supertypes": [],
            "declarations": ["enum entry FLOAT"],
            "jvm": ["static final field FLOAT:Lorg/pytorch/executorch/DType;"],
        },
        "org.pytorch.executorch.Module": {
            "language": "kotlin", "kind": "open class", "supertypes": ["java.io.Closeable"],
            "declarations": ["companion @JvmStatic @JvmOverloads fun load(modelPath: kotlin.String?, loadMode: kotlin.Int = ..., "
                             "numThreads: kotlin.Int = ...): org.pytorch.executorch.Module"],
            "jvm": ["static Companion.load$default(Lorg/pytorch/executorch/Module$Companion;Ljava/lang/String;IIILjava/lang/Object;)"
                    "Lorg/pytorch/executorch/Module;", "Companion.load(Ljava/lang/String;I)Lorg/pytorch/executorch/Module;"],
        },
    },
}


def test_identical_stubs_pass():
    assert api_check.compare_stubs(LISTING, copy.deepcopy(LISTING)) == []


def test_a_property_where_executorch_has_a_function_fails():
    stubs = copy.deepcopy(LISTING)
    t = stubs["classes"]["org.pytorch.executorch.Tensor"]
    t["declarations"] = [d for d in t["declarations"] if "getRawDataBuffer" not in d] + ["open val rawDataBuffer: java.nio.Buffer"]
    problems = api_check.compare_stubs(LISTING, stubs)
    assert any("`open val rawDataBuffer: java.nio.Buffer` is not in the listing" in p for p in problems)
    assert any("lacks the listing's declaration `open fun getRawDataBuffer(): java.nio.Buffer`" in p for p in problems)


def test_a_java_stub_of_a_kotlin_class_fails():
    stubs = copy.deepcopy(LISTING)
    stubs["classes"]["org.pytorch.executorch.Tensor"]["language"] = "java"
    assert api_check.compare_stubs(LISTING, stubs) == [
        "stubs: org.pytorch.executorch.Tensor: language is 'java', the listing says 'kotlin'"]


def test_missing_and_extra_classes_and_members_fail():
    stubs = copy.deepcopy(LISTING)
    del stubs["classes"]["org.pytorch.executorch.EValue"]
    stubs["classes"]["org.pytorch.executorch.Extra"] = copy.deepcopy(LISTING["classes"]["org.pytorch.executorch.EValue"])
    stubs["classes"]["org.pytorch.executorch.Tensor"]["jvm"].append("static numel([J)J")
    problems = api_check.compare_stubs(LISTING, stubs)
    assert "stubs: no class org.pytorch.executorch.EValue (the listing has it)" in problems
    assert "stubs: class org.pytorch.executorch.Extra is not in the listing" in problems
    assert "stubs: org.pytorch.executorch.Tensor: JVM member `static numel([J)J` is not in the listing" in problems
    assert len(problems) == 3


def refs(*items):
    return [tuple(x) for x in items]


def test_listed_calls_pass_and_unlisted_ones_fail():
    T = "org/pytorch/executorch/Tensor"
    ok = refs(("invokevirtual", T, "getRawDataBuffer", "()Ljava/nio/Buffer;"),
              ("invokestatic", T, "fromBlob", "(Ljava/nio/FloatBuffer;[J)Lorg/pytorch/executorch/Tensor;"),
              ("invokevirtual", T + "$Companion", "fromBlob", "(Ljava/nio/FloatBuffer;[J)Lorg/pytorch/executorch/Tensor;"),
              ("checkcast", T, None, None),
              ("getfield", "org/pytorch/executorch/EValue", "mTypeCode", "I"),
              ("putfield", "org/pytorch/executorch/EValue", "mData", "Ljava/lang/Object;"))
    assert api_check.check_calls(LISTING, ok) == []
    bad = refs(("invokevirtual", T, "getRawData", "()Ljava/nio/Buffer;"),                                   # no such member
               ("invokestatic", T, "getRawDataBuffer", "()Ljava/nio/Buffer;"),                              # not static
               ("invokevirtual", T, "fromBlob", "(Ljava/nio/FloatBuffer;[J)Lorg/pytorch/executorch/Tensor;"),  # static only
               ("invokevirtual", T, "getRawDataBuffer", "()Ljava/nio/FloatBuffer;"),                        # other descriptor
               ("putfield", "org/pytorch/executorch/EValue", "mTypeCode", "I"),                             # final
               ("new", "org/pytorch/executorch/LlmModule", None, None),                                     # no such class
               ("invokevirtual", T + "$Companion", "numel", "([J)J"))
    problems = api_check.check_calls(LISTING, bad)
    assert len(problems) == len(bad), problems


def test_inherited_enum_members_and_default_argument_calls():
    """What Kotlin compiles calls into: `when` over an enum calls java.lang.Enum.ordinal(); a call omitting default
    arguments calls the companion's synthetic static `load$default` (listed), never an instance one."""
    D, M = "org/pytorch/executorch/DType", "org/pytorch/executorch/Module$Companion"
    default = "(Lorg/pytorch/executorch/Module$Companion;Ljava/lang/String;IIILjava/lang/Object;)Lorg/pytorch/executorch/Module;"
    ok = refs(("invokevirtual", D, "ordinal", "()I"), ("getstatic", D, "FLOAT", "Lorg/pytorch/executorch/DType;"),
              ("invokestatic", M, "load$default", default),
              ("invokevirtual", M, "load", "(Ljava/lang/String;I)Lorg/pytorch/executorch/Module;"),
              ("invokeinterface", "org/pytorch/executorch/Module", "close", "()V"))          # java.io.Closeable's
    assert api_check.check_calls(LISTING, ok) == []
    bad = refs(("invokevirtual", D, "ordinalNumber", "()I"),
               ("invokevirtual", M, "load$default", default),
               ("invokevirtual", "org/pytorch/executorch/Tensor", "ordinal", "()I"))             # Tensor is no enum
    assert len(api_check.check_calls(LISTING, bad)) == 3


javac = shutil.which("javac")


@pytest.mark.skipif(javac is None or shutil.which("javap") is None, reason="needs a JDK (javac, javap)")
def test_compiled_calls_end_to_end(tmp_path):
    """Classes compiled with javac and read with javap: listed calls and JDK-inherited ones (getMessage) pass, an
    unlisted call fails with its name."""
    src = tmp_path / "src"
    (src / "org/pytorch/executorch").mkdir(parents=True)
    (src / "app").mkdir()
    (src / "org/pytorch/executorch/Tensor.java").write_text(
        "package org.pytorch.executorch;\npublic abstract class Tensor {\n"
        "  public java.nio.Buffer getRawDataBuffer() { return null; }\n"
        "  public java.nio.Buffer rawData() { return null; }\n}\n")
    (src / "org/pytorch/executorch/ExecutorchRuntimeException.java").write_text(
        "package org.pytorch.executorch;\npublic class ExecutorchRuntimeException extends RuntimeException {\n"
        "  public ExecutorchRuntimeException(int c, String d) { super(d); }\n  public int getErrorCode() { return 0; }\n}\n")
    (src / "app/Glue.java").write_text(
        "package app;\nimport org.pytorch.executorch.*;\npublic class Glue {\n"
        "  static Object a(Tensor t) { return t.getRawDataBuffer(); }\n"
        "  static String b(ExecutorchRuntimeException e) { return e.getMessage() + e.getErrorCode(); }\n}\n")
    out = tmp_path / "classes"
    subprocess.run([javac, "-d", str(out), *map(str, src.rglob("*.java"))], check=True)
    listing = copy.deepcopy(LISTING)
    found = api_check.references(api_check.javap_classes([str(out / "app")]))
    assert ("invokevirtual", "org/pytorch/executorch/Tensor", "getRawDataBuffer", "()Ljava/nio/Buffer;") in found
    assert api_check.check_calls(listing, found) == []

    (src / "app/Glue.java").write_text(
        "package app;\nimport org.pytorch.executorch.*;\npublic class Glue {\n"
        "  static Object a(Tensor t) { return t.rawData(); }\n}\n")
    subprocess.run([javac, "-d", str(out), *map(str, src.rglob("*.java"))], check=True)
    problems = api_check.check_calls(listing, api_check.references(api_check.javap_classes([str(out / "app")])))
    assert problems == ["calls: invokevirtual org.pytorch.executorch.Tensor.rawData()Ljava/nio/Buffer; is not in the listing"]


def test_main_exit_codes(tmp_path, capsys):
    (tmp_path / "l.json").write_text(json.dumps(LISTING))
    bad = copy.deepcopy(LISTING)
    bad["classes"]["org.pytorch.executorch.Tensor"]["kind"] = "class"
    (tmp_path / "s.json").write_text(json.dumps(bad))
    assert api_check.main(["stubs", str(tmp_path / "l.json"), str(tmp_path / "l.json")]) == 0
    assert api_check.main(["stubs", str(tmp_path / "l.json"), str(tmp_path / "s.json")]) == 1
    assert api_check.main(["nonsense"]) == 2
    assert "Error: usage" in capsys.readouterr().err


def test_recorded_listing_has_the_published_shapes():
    """The committed listing (ExecuTorch's sources): Tensor is Kotlin with `fun getRawDataBuffer()` and no
    rawDataBuffer property; Module.load's @JvmOverloads overloads; ExecutorchRuntimeException.errorCode a property."""
    listing = json.loads((REPO / "android/api/executorch-android.json").read_text())
    c = listing["classes"]
    tensor = c["org.pytorch.executorch.Tensor"]
    assert tensor["language"] == "kotlin"
    assert "open fun getRawDataBuffer(): java.nio.Buffer" in tensor["declarations"]
    assert not any("rawDataBuffer" in d for d in tensor["declarations"])
    assert {"static load(Ljava/lang/String;)Lorg/pytorch/executorch/Module;", "static load(Ljava/lang/String;I)Lorg/pytorch/executorch/Module;",
            "static load(Ljava/lang/String;II)Lorg/pytorch/executorch/Module;"} <= set(c["org.pytorch.executorch.Module"]["jvm"])
    assert "val errorCode: kotlin.Int" in c["org.pytorch.executorch.ExecutorchRuntimeException"]["declarations"]
    assert len(listing["source"]["commit"]) == 40
