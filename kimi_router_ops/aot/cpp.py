"""The C++ the build generates: kimi_tables.h (the dispatch's tables, from kimi_router_ops/tables/; every
build) and kimi_kernels.h (per family: the argument struct, the table of compiled kernels and
one launch adapter a kernel, over the headers export_to_c wrote; CUDA builds). Each struct is
written from the same list as its rows, so no layout is restated by hand."""

from .. import tables
from .families import FAMILIES, SCALAR_TYPES, compiled_kernels

_C_SCALARS = {"int32": "int32_t", "float32": "float"}


def _struct(name: str, doc: str, fields, aliases=()) -> str:
    """fields: (C++ type, name, comment) triples; aliases: `using` lines before them."""
    body = "\n".join([*(f"  using {alias};" for alias in aliases),
                      *(f"  {ctype} {field};" + (f"  // {note}" if note else "") for ctype, field, note in fields)])
    return f"// {doc}\nstruct {name} {{\n{body}\n}};\n"


def _array(ctype: str, name: str, rows) -> str:
    """rows: tuples of C++ literals, in the struct's field order."""
    body = "\n".join("    {" + ", ".join(row) + "}," for row in rows)
    return f"inline constexpr {ctype} {name}[] = {{\n{body}\n}};\n"


def _table(name, doc, array, fields, rows, aliases=()) -> str:
    """A struct and its rows from one list of (C++ type, name, comment, value of a row): the
    dispatch's tables and each family's table of compiled kernels."""
    return (_struct(name, doc, [(t, f, note) for t, f, note, _ in fields], aliases) + "\n"
            + _array(name, array, [tuple(value(r) for *_, value in fields) for r in rows]))


def _bool(b) -> str:
    return str(bool(b)).lower()


def _string(s) -> str:
    return f'"{s}"'


_GEMM_ROW = (
    ("const char*", "name", "", lambda r: _string(r.name)),
    ("int", "max_m", "the largest M it computes", lambda r: str(r.max_m)),
    ("bool", "scalar_loads", "also compiled with scalar loads (any K, any alignment)", lambda r: _bool(1 in r.kernel.vecs)),
    ("int", "vec16", "elements of one 16-byte load of weights: 8 (bf16) or 4 (fp32)", lambda r: str(r.kernel.vecs[0])),
    ("c10::ScalarType", "weight_dtype", "", lambda r: SCALAR_TYPES[r.kernel.weight_dtype]),
    ("int64_t", "k_only", "the one K it computes (K compiled in); 0: any K", lambda r: str(getattr(r.kernel, "k", 0))),
)
_CHOICE_ROW = (
    ("int", "variant", "index into kVariantRows; -1: cuBLAS",
     lambda c: str(next((i for i, r in enumerate(tables.gemm.ALL_VARIANTS) if r.name == c.variant), -1))),
    ("int", "m_lo", "", lambda c: str(c.m_lo)), ("int", "m_hi", "", lambda c: str(c.m_hi)),
    ("int64_t", "n_min", "", lambda c: str(c.n_min)), ("int64_t", "n_max", "", lambda c: str(c.n_max)),
    ("int64_t", "k_min", "", lambda c: str(c.k_min)), ("int64_t", "k_max", "", lambda c: str(c.k_max)),
    ("c10::ScalarType", "weight_dtype", "", lambda c: SCALAR_TYPES[c.weight_dtype]),
)
_ROUTER_ROW = (
    ("const char*", "name", "", lambda r: _string(r.name)),
    ("int", "m_lo", "chosen for m_lo <= M <= m_hi and n_min <= N <= n_max (first match)", lambda r: str(r.m_lo)),
    ("int", "m_hi", "", lambda r: str(r.m_hi)),
    ("int", "n_min", "", lambda r: str(r.n_min)),
    ("int", "n_max", "also the most experts its routing handles (compiled in)", lambda r: str(r.n_max)),
    ("c10::ScalarType", "weight_dtype", "of its GEMM row", lambda r: SCALAR_TYPES[r.weight_dtype]),
    ("int64_t", "k_only", "the one K its GEMM row computes (K compiled in); 0: any K", lambda r: str(r.k_only)),
)


def tables_header() -> str:
    scoring = ", ".join(f"k{s.name.title()} = {s.value}" for s in tables.Scoring)
    names = ", ".join(_string(s.name.lower()) for s in tables.Scoring)
    constants = {
        "kRouterMaxTopK": tables.ROUTER_MAX_TOP_K, "kRouterMaxM": max(r.m_hi for r in tables.router.ROUTER_VARIANTS),
        "kRouterMaxN": max(r.n_max for r in tables.router.ROUTER_VARIANTS), "kRouterMaxGroups": tables.ROUTER_MAX_GROUPS,
        "kAttnResMaxBlocks": tables.attn_res.ATTN_RES_KERNEL.max_blocks, "kAttnResMaxHidden": tables.attn_res.ATTN_RES_KERNEL.max_hidden,
    }
    return "\n".join([
        "// Generated from kimi_router_ops/tables/ by kimi_router_ops.aot. Do not edit.",
        "#pragma once\n",
        "#include <torch/headeronly/core/ScalarType.h>\n",
        "#include <cstdint>\n",
        "namespace kimi {\n",
        "// How logits become routing scores (tables.Scoring): the ops' `scoring` argument names one.",
        f"enum class Scoring : int32_t {{ {scoring} }};",
        f"inline constexpr const char* kScoringNames[] = {{{names}}};\n",
        _struct("RoutingScalars", "The routing kernels' scalar arguments (tables.ROUTING_SCALARS).",
                [(_C_SCALARS[kind], name, "") for name, kind in tables.ROUTING_SCALARS]),
        "// inline: one array for the whole program, so row pointers compare across files.",
        _table("VariantRow", "A GEMM kernel (tables.gemm.ALL_VARIANTS).", "kVariantRows", _GEMM_ROW, tables.gemm.ALL_VARIANTS),
        _table("ChoiceRow", "The GEMM dispatch (tables.gemm.CHOICES): the first row that holds M, N, K and the "
               "weights' dtype.", "kChoiceRows", _CHOICE_ROW, tables.gemm.CHOICES),
        "// The GEMM dispatch in batch-invariant mode (tables.gemm.BATCH_INVARIANT_CHOICES).",
        _array("ChoiceRow", "kBatchInvariantChoiceRows",
               [tuple(value(c) for *_, value in _CHOICE_ROW) for c in tables.gemm.BATCH_INVARIANT_CHOICES]),
        _table("RouterRow", "A fused router kernel (tables.router.ROUTER_VARIANTS): a GEMM kernel plus routing.",
               "kRouterRows", _ROUTER_ROW, tables.router.ROUTER_VARIANTS),
        *(f"inline constexpr int {name} = {value};" for name, value in constants.items()),
        "// The architectures every kernel family is compiled for (tables.ARCHS).",
        "inline constexpr bool kernels_built_for(int64_t sm) {",
        f"  return {' || '.join(f'sm == {sm}' for _, sm in tables.ARCHS)};",
        "}",
        "\n}  // namespace kimi\n",
    ])


def _call_arguments(fam) -> str:
    """The wrapper's arguments from an args struct `a` (tensors cast to the export's types)."""
    out = []
    for p in fam.params:
        if p.kind in ("tensor", "tensor3"):
            out.append(f"reinterpret_cast<{{s}}_Tensor_{p.name}_t*>(&a->{p.name})")
        elif p.kind == "routing":
            out += [f"a->routing.{name}" for name, _ in tables.ROUTING_SCALARS]
        else:
            out.append(f"a->{p.name}")
    return ", ".join(out)


def _args_struct(fam) -> str:
    kinds = {"tensor": "TensorArg", "tensor3": "Tensor3Arg", "routing": "RoutingScalars", **_C_SCALARS}
    return _struct(f"{fam.name}Args", f"The arguments of a {fam.name} kernel, in the kernel's order.",
                   [(kinds[p.kind], p.name, "") for p in fam.params])


def _kernel_table(fam, kernels) -> str:
    """<Family>Kernel and k<Family>Kernels: each compiled kernel, its row's fields and its
    entry points."""
    fields = (("const char*", "symbol", "", lambda k: _string(k.symbol)),
              ("int", "sm", "compute capability it runs on, major * 10 + minor", lambda k: str(k.sm)),
              *fam.fields,
              ("ModuleFn", "init", "loads the embedded cubin (once a process)", lambda k: f"_mlir_{k.symbol}_cuda_init"),
              ("ModuleFn", "load_to_device", "sets the kernel's attributes on one device",
               lambda k: f"_mlir_{k.symbol}_cuda_load_to_device"),
              ("Launch", "launch", "", lambda k: f"launch_{k.symbol}"))
    return _table(f"{fam.name}Kernel", f"One compiled {fam.name} kernel.", f"k{fam.name}Kernels", fields, kernels,
                  aliases=(f"Args = {fam.name}Args", "Launch = int32_t (*)(Args* args, cudaStream_t stream)"))


def kernels_header() -> str:
    includes, parts, symbols = [], [], []
    for fam in FAMILIES:
        kernels = compiled_kernels(fam.name)
        call = _call_arguments(fam)
        tensors = [p.name for p in fam.params if p.kind in ("tensor", "tensor3")]
        adapters = []
        for k in kernels:
            s = k.symbol
            includes.append(f'#include "{k.arch}/{s}.h"')
            symbols.append(_string(s))
            checks = "".join(
                f'  static_assert(sizeof({s}_Tensor_{t}_t) == sizeof(a->{t}), "ABI mismatch");\n' for t in tensors)
            adapters.append(f"inline int32_t launch_{s}({fam.name}Args* a, cudaStream_t stream) {{\n{checks}"
                            f"  return cute_dsl_{s}_wrapper(nullptr, {call.format(s=s)}, stream);\n}}")
        parts += [_args_struct(fam), "\n\n".join(adapters) + "\n", _kernel_table(fam, kernels)]
    return "\n".join([
        "// Generated by kimi_router_ops.aot. Do not edit.",
        "#pragma once\n",
        '#include "kernel_abi.h"',
        '#include "kimi_tables.h"',
        *includes,
        "\nnamespace kimi {\n",
        *parts,
        "inline constexpr const char* kKernelSymbols[] = {\n" + "".join(f"    {s},\n" for s in symbols) + "};\n",
        "}  // namespace kimi\n",
    ])
