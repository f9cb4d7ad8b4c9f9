"""The native kernels' table (toolchain/mesp/kernels.py) is kernels.cpp: its `EXECUTORCH_LIBRARY` lines register
exactly the table's ops, each with a wrapper whose C++ parameters are the op's schema, and its `extern "C"` entry
points are exactly the table's, with the table's ctypes signatures. So a kernel added to one and not the other, or
a signature changed on one side, fails here (the ctypes call would otherwise pass wrong arguments silently).

kernels.cpp is read as text (comments removed): the registration lines and the entry points stay in kernels.cpp,
whatever headers hold the vector code (kernels_x86.h, kernels_arm64.h). The fused methods' use of each op (the
table's `methods`) is checked by tracing them."""

from __future__ import annotations

import ctypes
import re

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from toolchain.mesp.kernels import KERNELS, Kernel, c_signatures, executorch_ops, generation_ops
from toolchain.native import KERNEL_SOURCE

_TOKEN = re.compile(r'("(?:\\.|[^"\\\n])*")|(//[^\n]*)|(/\*.*?\*/)', re.S)


def _without_comments(src: str) -> str:
    """The source with its comments blanked (string literals kept: `extern "C"`, the ops' names)."""
    return _TOKEN.sub(lambda m: m.group(1) or " " * len(m.group(0)), src)


def _closing(src: str, i: int) -> int:
    """Index of the brace closing the one at src[i]."""
    depth = 0
    for j in range(i, len(src)):
        depth += {"{": 1, "}": -1}.get(src[j], 0)
        if depth == 0:
            return j
    raise AssertionError(f"unbalanced braces after offset {i}")


def _top_level(src: str) -> str:
    """`src` with every brace-enclosed body collapsed to `{}`: what is left are declarations at this level."""
    out, i = [], 0
    while i < len(src):
        if src[i] == "{":
            j = _closing(src, i)
            out.append("{}")
            i = j + 1
        else:
            out.append(src[i])
            i += 1
    return "".join(out)


_C_TYPES = {"int": ctypes.c_int, "int64_t": ctypes.c_int64, "int32_t": ctypes.c_int32, "float": ctypes.c_float,
            "double": ctypes.c_double, "size_t": ctypes.c_size_t, "uint8_t": ctypes.c_uint8}
_QUALIFIERS = {"const", "volatile", "__restrict", "__restrict__", "restrict", "static", "inline", "extern"}


def _ctype(decl: str, named: bool):
    """The ctypes type of a C parameter (`named`: its last identifier is the parameter's name) or return type:
    pointers are c_void_p (char pointers c_char_p), as the table writes them."""
    decl = re.sub(r"__attribute__\s*\(\(.*?\)\)", " ", decl)
    tokens = [t for t in re.findall(r"\w+|\*", decl) if t not in _QUALIFIERS]
    if named and len(tokens) > 1 and tokens[-1] != "*" and tokens[-1] not in _C_TYPES and tokens[-1] != "char":
        tokens = tokens[:-1]
    if "*" in tokens:
        return ctypes.c_char_p if tokens == ["char", "*"] else ctypes.c_void_p
    assert len(tokens) == 1 and tokens[0] in _C_TYPES, f"no ctypes mapping for C type {decl!r}"
    return _C_TYPES[tokens[0]]


_DEFINITION = re.compile(r"([\w\s\*]+?)\b(toolchain_\w+)\s*\(([^()]*)\)\s*\{\}")


def entry_points(src: str) -> dict[str, tuple[type, tuple[type, ...]]]:
    """The `extern "C"` functions `toolchain_*` defined in `src` (blocks and single declarations): name ->
    (ctypes restype, argtypes)."""
    code = re.sub(r"^\s*#.*$", "", _without_comments(src), flags=re.M)      # preprocessor lines
    regions = []
    for m in re.finditer(r'extern\s+"C"\s*', code):
        start = m.end()
        if code[start] == "{":
            regions.append(code[start + 1:_closing(code, start)])
        else:                                   # extern "C" <one declaration>
            brace = code.index("{", start)
            regions.append(code[start:_closing(code, brace) + 1])
    found = {}
    for region in regions:
        for m in _DEFINITION.finditer(_top_level(region)):
            ret = m.group(1).split(";")[-1].split("}")[-1]
            params = [p for p in (s.strip() for s in m.group(3).split(",")) if p and p != "void"]
            sig = (_ctype(ret, named=False), tuple(_ctype(p, named=True) for p in params))
            assert found.setdefault(m.group(2), sig) == sig, f"{m.group(2)} is defined twice, differently"
    return found


def registrations(src: str) -> dict[str, str]:
    """The `EXECUTORCH_LIBRARY(namespace, "op.overload", wrapper)` lines: op name -> wrapper function."""
    code = _without_comments(src)
    lines = re.findall(r'^\s*EXECUTORCH_LIBRARY\s*\(\s*(\w+)\s*,\s*"([\w.]+)"\s*,\s*(\w+)\s*\)\s*;', code, re.M)
    return {f"{ns}::{op}": fn for ns, op, fn in lines}


# The C++ parameter of an ExecuTorch kernel for each schema argument type.
_SCHEMA_CXX = {"Tensor": "constTensor&", "Tensor?": "conststd::optional<Tensor>&", "int": "int64_t",
               "float": "double"}


def _param_type(param: str) -> str:
    """`const Tensor& x` -> `constTensor&`, `int64_t group` -> `int64_t`: the type without the name or spaces."""
    if "&" in param:
        return re.sub(r"\s+", "", param).rsplit("&", 1)[0] + "&"
    return "".join(param.split()[:-1])


def wrapper_params(src: str, fn: str) -> list[str]:
    """The parameters of the ExecuTorch wrapper `fn` (after its KernelRuntimeContext, before `out`), as their
    types with spaces removed."""
    code = _without_comments(src)
    m = re.search(rf"\bTensor\s*&\s*{fn}\s*\(([^)]*)\)\s*\{{", code)
    assert m, f"no definition of the wrapper {fn}"
    params = [_param_type(p) for p in m.group(1).split(",")]
    assert params[0] == "KernelRuntimeContext&" and params[-1] == "Tensor&", f"{fn}: {m.group(1)}"
    return params[1:-1]


def schema_types(schema: str) -> list[str]:
    return [arg.strip().rsplit(" ", 1)[0] for arg in schema.split(",")]


@pytest.fixture(scope="module")
def source() -> str:
    return KERNEL_SOURCE.read_text()


def test_registered_ops_are_the_tables(source):
    registered = registrations(source)
    assert registered, "no EXECUTORCH_LIBRARY line found in kernels.cpp"
    assert sorted(registered) == sorted(executorch_ops())
    assert len(registrations(source)) == len(re.findall(r"^\s*EXECUTORCH_LIBRARY\s*\(", _without_comments(source),
                                                         re.M)), "an EXECUTORCH_LIBRARY line this test cannot read"


def test_each_wrapper_takes_its_ops_schema(source):
    registered = registrations(source)
    for k in KERNELS:
        if k.op is None:
            continue
        want = [_SCHEMA_CXX[t] for t in schema_types(k.schema)]
        assert wrapper_params(source, registered[k.op]) == want, k.name


def test_entry_points_and_their_signatures_are_the_tables(source):
    found = entry_points(source)
    assert sorted(found) == sorted(c_signatures()), "kernels.cpp's extern \"C\" entry points differ from the table"
    for name, (restype, argtypes) in c_signatures().items():
        assert found[name] == (restype, tuple(argtypes)), name


def test_the_schema_comments_agree_with_the_table(source):
    """The wrappers' comments state their op's schema (`// toolchain::op.out(...)`); where one does, it is the
    table's (so a reader of kernels.cpp reads the schema the op is registered with)."""
    comments = " ".join(line.split("//", 1)[1].strip() for line in source.splitlines() if line.strip().startswith("//"))
    for k in KERNELS:
        if k.op is None:
            continue
        m = re.search(rf"{re.escape(k.op)}\((.*?), \*, Tensor\(a!\) out\)", comments)
        if m is not None:
            assert " ".join(m.group(1).split()) == " ".join(k.schema.split()), k.name


def test_the_parser_sees_what_it_must():
    """The reader on shapes kernels.cpp may take: a C-only entry declared on its own line, a char pointer result,
    a (void) parameter list, comments and nested braces; an entry outside extern "C" is not an entry point."""
    src = '''
    namespace { int toolchain_helper(int a) { return a; } }   // not extern "C"
    extern "C" const char* toolchain_kernel_path() { static const char* p = "x"; return p; }
    extern "C" {
    // int toolchain_commented(float x) {}
    int toolchain_a(const float* __restrict x, int64_t n, float eps, uint8_t* out) { if (n) { return 0; } return 1; }
    /* block */ int toolchain_b(void) { return 0; }
    }  // extern "C"
    EXECUTORCH_LIBRARY(toolchain, "a.out", a_out);
    '''
    assert entry_points(src) == {
        "toolchain_kernel_path": (ctypes.c_char_p, ()),
        "toolchain_a": (ctypes.c_int, (ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_void_p)),
        "toolchain_b": (ctypes.c_int, ()),
    }
    assert registrations(src) == {"toolchain::a.out": "a_out"}


def test_a_c_only_entry_is_one_row():
    row = Kernel("kernel_path", (), ctypes.c_char_p)
    assert row.entry == "toolchain_kernel_path" and row.op is None
    with pytest.raises(ValueError, match="schema, reference and meta together"):
        Kernel("half", (), schema="Tensor x")
    with pytest.raises(ValueError, match="called by no method"):
        Kernel("x", (), methods=("block_decode",))


class _ToolchainOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.called: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "toolchain":
            self.called.add(f"toolchain::{func._schema.name.split('::')[1]}.out")
        return func(*args, **(kwargs or {}))


def test_the_fused_methods_call_the_ops_the_table_says():
    """Each fused generation method of an int4 program (plain RoPE) calls exactly the ops whose `methods` name
    its role."""
    from toolchain.contract import GENERATION_ROLES
    from toolchain.export.bodies import example_inputs, method_module
    from toolchain.program.spec import FUSED_KERNELS, ProgramSpec, QuantSpec, method_specs
    from toolchain.lora import LoraConfig
    from toolchain.models import ModelArch

    assert FUSED_KERNELS == generation_ops()
    assert set(executorch_ops()) - set(generation_ops()) == {                                # training only
        "toolchain::int4_dyw_a8.out", "toolchain::int4_dyw_a8_acc.out", "toolchain::lora_linear_a8_rows.out",
        "toolchain::attention_train.out", "toolchain::attention_train_backward.out",
        "toolchain::swiglu_train.out", "toolchain::online_softmax_stats.out", "toolchain::exp_sub_rows.out",
        "toolchain::lora_backward.out", "toolchain::lora_rows_backward.out", "toolchain::rope_train.out",
        "toolchain::rope_train_backward.out", "toolchain::rms_norm_backward.out"}
    arch = ModelArch(hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, vocab=96, max_positions=64)
    spec = ProgramSpec(arch, LoraConfig(rank=4, alpha=8, targets=("q_proj", "v_proj", "down_proj")), 16,
                       quant=QuantSpec("int4", 16), generation=True, prefill_chunk=4)
    fused = {name: m for name, m in method_specs(spec).items() if m.kernels}
    assert sorted(m.role for m in fused.values()) == ["block_decode", "block_prefill", "head_logits"]
    for name, m in fused.items():
        assert m.role in GENERATION_ROLES and m.kernels == FUSED_KERNELS
        mode = _ToolchainOps()
        with torch.no_grad(), mode:
            method_module(spec, name)(*example_inputs(m))
        assert mode.called == {k.op for k in KERNELS if m.role in k.methods}, name


def test_android_registration_check_lists_every_kernel_of_the_table():
    """android/native/registration_check.cpp asks the app's ExecuTorch registry for each op a fused generation
    method or a `--compute int8` training method calls: its list must be the table's (an op left out would let an
    app load a program its runtime cannot run; android/test.sh builds and runs the check)."""
    from pathlib import Path

    from toolchain.program.spec import FUSED_KERNELS, INT8_KERNELS

    src = (Path(__file__).resolve().parents[2] / "android" / "native" / "registration_check.cpp").read_text()
    body = _without_comments(src)
    listed = re.findall(r'"(toolchain::[a-z0-9_]+\.out)"', body[body.index("ops[]"):])
    assert len(listed) == len(set(listed)), listed
    wanted = set(FUSED_KERNELS) | set(INT8_KERNELS)
    assert set(listed) == wanted, (sorted(wanted - set(listed)), sorted(set(listed) - wanted))
