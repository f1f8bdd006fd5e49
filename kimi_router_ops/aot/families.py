"""The kernel families: one record each says what a family compiles, how, and what its
exported kernels take, from which the build writes the C++ argument struct, the table of
compiled kernels and one launch adapter a kernel (cpp.py).

A family's `params` are its CuTe DSL kernel's arguments in order (before the stream): the
fake arguments it is compiled on and the C struct that carries them to it come from them, so
the two cannot disagree. CuTe DSL and the kernel modules are imported only when compiling.
"""

import os
from dataclasses import dataclass
from typing import Callable

from .. import tables


@dataclass(frozen=True)
class Param:
    """One argument of an exported kernel. A tensor ("tensor", rank 2, or "tensor3") has
    `dims`, the names of its run-time sizes (a name is one size wherever it stands in a
    family's params; ONE stands for 1), a `dtype` (a dtype name or a role the family's
    `layout` gives a dtype for), and if `vec`, rows of whole vectors: its inner size and
    strides multiples of the family's vector, its base aligned to one. A scalar is "int32",
    "float32", or "routing" (the ROUTING_SCALARS)."""

    name: str
    kind: str
    dtype: str = ""
    dims: tuple = ()
    vec: bool = False


@dataclass(frozen=True)
class Kernel:
    """One compiled kernel: a table row of a family for one architecture (and vector width,
    dtypes where the family compiles several)."""

    family: str
    row: object
    arch: str
    sm: int
    symbol: str
    vec: int = 0
    x_dtype: str = ""
    out_dtype: str = ""
    bias_dtype: str = ""


@dataclass(frozen=True)
class Family:
    """`name` gives the C++ names (<name>Args, <name>Kernel, k<name>Kernels); `fields` are the
    (C++ type, name, comment, value of a Kernel) of its C++ table's rows besides the symbol,
    sm and entry points (cpp.py's `_table`, as the dispatch's tables); `kernels`
    lists what one architecture compiles; `compile` gives a kernel's CuTe DSL object, and
    `layout` its vector width ("vec") and the dtype of each dtype role of its params."""

    name: str
    params: tuple
    fields: tuple
    kernels: Callable[[str, int], list]
    compile: Callable[[Kernel], object]
    layout: Callable[[Kernel], dict]


def _params(spec: str) -> tuple:
    """'x w:M,K:x/v gate_bias:ONE,N:weight has_gate_bias:int32' -> Params: a tensor's sizes,
    dtype and "/v" where its rows are vectors; a scalar's kind. A name without a kind takes
    the next one's."""
    params, pending = [], []
    for word in spec.split():
        name, _, kind = word.partition(":")
        pending.append(name)
        if kind:
            if kind in ("int32", "float32", "routing"):
                params += [Param(n, kind) for n in pending]
            else:
                dims, dtype = kind.split(":")
                dims = tuple(dims.split(","))
                params += [Param(n, "tensor" if len(dims) == 2 else "tensor3", dtype.removesuffix("/v"), dims,
                                 dtype.endswith("/v")) for n in pending]
            pending = []
    assert not pending, spec
    return tuple(params)


_SHORT = {"float32": "f32", "bfloat16": "bf16"}
SCALAR_TYPES = {"float32": "c10::ScalarType::Float", "bfloat16": "c10::ScalarType::BFloat16"}


def _dsl_type(dtype: str):
    import cutlass

    return {"float32": cutlass.Float32, "bfloat16": cutlass.BFloat16, "int32": cutlass.Int32}[dtype]


# -- GEMM ---------------------------------------------------------------------------------


LAB_ENV = "KIMI_ROUTER_OPS_LAB"


def lab_build() -> bool:
    """Whether this build compiles the lab rows too (tables.gemm.LAB_VARIANTS):
    KIMI_ROUTER_OPS_LAB=1, for benchmarks and experiments; wheels ship the product rows."""
    return os.environ.get(LAB_ENV) == "1"


def _gemm_kernels(arch, sm):
    rows = tables.gemm.ALL_VARIANTS if lab_build() else tables.gemm.VARIANTS
    return [
        Kernel("Gemm", row, arch, sm, f"kimi_{row.name}_v{vec}{_x_suffix(row, x)}_{_SHORT[out]}_{arch}",
               vec=vec, x_dtype=x, out_dtype=out)
        for row in rows for vec in row.kernel.vecs for x in row.x_dtypes for out in tables.OUT_DTYPES
    ]


def _x_suffix(row, x_dtype):
    """_x<dtype> where the row takes more than bf16 hidden_states."""
    return f"_x{_SHORT[x_dtype]}" if len(row.x_dtypes) > 1 else ""


def gemm_object(row, vec, x_dtype="bfloat16", trigger=None):
    """The GEMM kernel of a row, with its compile-time parameters (and its trigger point
    unless another is given: a fused router row's own)."""
    from dataclasses import asdict

    from ..kernels.gemm_dotprod import GemmDotprod
    from ..kernels.gemm_mma import GemmMma

    params = asdict(row.kernel)
    launch = dict(prefetch=row.prefetch, pdl=row.pdl, trigger=trigger or row.trigger)
    if isinstance(row.kernel, tables.gemm.Mma):
        return GemmMma(**params, **launch)
    params.update(max_m=params.pop("tokens"), vec=vec, weight_dtype=_dsl_type(params["weight_dtype"]),
                  x_dtype=_dsl_type(x_dtype))
    return GemmDotprod(**params, **launch)


def _compile_gemm(k):
    return gemm_object(k.row, k.vec, k.x_dtype)


def _gemm_layout(k):
    return dict(vec=k.vec, x=k.x_dtype, weight=k.row.kernel.weight_dtype, out=k.out_dtype)


# -- fused router ---------------------------------------------------------------------------


def _router_kernels(arch, sm):
    return [Kernel("Router", row, arch, sm, f"kimi_{row.name}_{_SHORT[bias]}_{arch}", bias_dtype=bias)
            for row in tables.router.ROUTER_VARIANTS for bias in tables.BIAS_DTYPES]


def router_object(row):
    from ..kernels.router_fused import FusedRouter

    gemm_row = tables.gemm.variant(row.gemm)
    gemm = gemm_object(gemm_row, gemm_row.kernel.vecs[0], trigger=row.trigger)
    return FusedRouter(gemm, n_max=row.n_max, exclusive=row.exclusive, bias_prefetch=row.bias_prefetch,
                        at_publisher=row.at_publisher)


def _compile_router(k):
    return router_object(k.row)


def _router_layout(k):
    weight = k.row.weight_dtype
    return dict(vec=8 if weight == "bfloat16" else 4, weight=weight, bias=k.bias_dtype)


# -- the gate and a projection -------------------------------------------------------------


def _projection_kernels(arch, sm):
    return [Kernel("Projection", row, arch, sm, f"kimi_{row.name}_{arch}") for row in tables.projection.PROJECTION_KERNELS]


def _compile_projection(k):
    from ..kernels.gate_projection import GateProjection

    row = k.row
    return GateProjection(row.m_hi, row.rows, row.unroll, row.threads, row.ctas_per_sm)


# -- routing --------------------------------------------------------------------------------


def _routing_kernels(arch, sm):
    return [Kernel("Routing", row, arch, sm,
                   f"kimi_moe_routing_n{row.n_max}_{_SHORT[row.logits_dtype]}_{_SHORT[row.bias_dtype]}_{arch}")
            for row in tables.routing.ROUTING_KERNELS]


def _compile_routing(k):
    from ..kernels.moe_routing import MoeRouting

    return MoeRouting(k.row.n_max, tables.routing.ROUTING_WARPS)


# -- norms ----------------------------------------------------------------------------------


def _norm_kernels(arch, sm):
    return [Kernel("Norm", row, arch, sm, f"kimi_{row.op}_v{row.vec}_{arch}") for row in tables.norm.NORM_KERNELS]


def _compile_norm(k):
    from ..kernels.rms_norm import RmsNorm

    return RmsNorm(k.row.vec, k.row.op == "fused_add_rms_norm", k.row.threads, k.row.unroll)


# -- AttnRes --------------------------------------------------------------------------------


def _attn_res_kernels(arch, sm):
    return [Kernel("AttnRes", tables.attn_res.ATTN_RES_KERNEL, arch, sm, f"kimi_attn_res_{arch}")]


def _compile_attn_res(k):
    from ..kernels.attn_res import AttnRes

    row = k.row
    return AttnRes(row.cluster, row.threads, row.max_blocks)


def _index(rows, row) -> str:
    return str(rows.index(row))


_ROUTING_OUTPUTS = "weights:M,TOPK:float32 ids:M,TOPK:int32"  # ids as int32 words
_HASH_AND_COUNTS = "input_ids:ONE,IDS:int32 hash_table:V,C:int32 counts:ONE,NS:int32"  # int32 words

FAMILIES = (
    Family("Gemm", _params("x:M,K:x/v w:N,K:weight/v gate_bias:ONE,N:weight out:M,N:out has_gate_bias:int32"),
           (("int", "variant", "", lambda k: _index(tables.gemm.ALL_VARIANTS, k.row)), ("int", "vec", "", lambda k: str(k.vec)),
            ("c10::ScalarType", "x_dtype", "", lambda k: SCALAR_TYPES[k.x_dtype]),
            ("c10::ScalarType", "out_dtype", "", lambda k: SCALAR_TYPES[k.out_dtype])),
           _gemm_kernels, _compile_gemm, _gemm_layout),
    Family("Router", _params("x:M,K:bfloat16/v w:N,K:weight/v gate_bias:ONE,N:weight bias:ONE,N:bias "
                             f"logits:M,N:float32 {_ROUTING_OUTPUTS} handoff:M,N:int32 {_HASH_AND_COUNTS} "
                             "routing:routing has_gate_bias:int32"),
           (("int", "router", "", lambda k: _index(tables.router.ROUTER_VARIANTS, k.row)),
            ("c10::ScalarType", "bias_dtype", "", lambda k: SCALAR_TYPES[k.bias_dtype])),
           _router_kernels, _compile_router, _router_layout),
    Family("Projection", _params("x:M,K:bfloat16/v w:N,K:bfloat16/v gate_bias:ONE,N:bfloat16 logits:M,N:float32 "
                                 "p:L,K:bfloat16/v projection:M,L:bfloat16 has_gate_bias ctas:int32"),
           (("int", "m_lo", "", lambda k: str(k.row.m_lo)), ("int", "m_hi", "", lambda k: str(k.row.m_hi)),
            ("int", "ctas_per_sm", "", lambda k: str(k.row.ctas_per_sm)), ("int64_t", "max_k", "", lambda k: str(k.row.max_k))),
           _projection_kernels, _compile_projection, lambda k: dict(vec=8)),
    Family("Routing", _params(f"logits:M,N:logits bias:ONE,N:bias {_ROUTING_OUTPUTS} {_HASH_AND_COUNTS} routing:routing"),
           (("int", "n_min", "", lambda k: str(k.row.n_min)), ("int", "n_max", "", lambda k: str(k.row.n_max)),
            ("c10::ScalarType", "logits_dtype", "", lambda k: SCALAR_TYPES[k.row.logits_dtype]),
            ("c10::ScalarType", "bias_dtype", "", lambda k: SCALAR_TYPES[k.row.bias_dtype])),
           _routing_kernels, _compile_routing, lambda k: dict(logits=k.row.logits_dtype, bias=k.row.bias_dtype)),
    Family("Norm", _params("x residual:M,K:bfloat16/v weight:ONE,K:bfloat16/v out residual_out:M,K:bfloat16/v "
                           "eps:float32"),
           (("bool", "add_residual", "", lambda k: str(k.row.op == "fused_add_rms_norm").lower()),
            ("int", "vec", "", lambda k: str(k.row.vec))),
           _norm_kernels, _compile_norm, lambda k: dict(vec=k.row.vec)),
    Family("AttnRes", _params("prefix delta:M,H:bfloat16/v blocks:M,R,H:bfloat16/v "
                              "norm_weight qk_weight output_norm_weight:ONE,H:bfloat16/v out:M,H:bfloat16/v "
                              "num_blocks block_write_idx has_delta has_output_norm:int32 eps output_norm_eps:float32"),
           (), _attn_res_kernels, _compile_attn_res, lambda k: dict(vec=8)),
)


def compiled_kernels(name: str = "", arch: str = "") -> list:
    """Every kernel the build compiles (of one family, for one architecture), in table order."""
    return [k for f in FAMILIES if name in ("", f.name) for a, sm in tables.ARCHS if arch in ("", a)
            for k in f.kernels(a, sm)]


def fake_arguments(fam: Family, kernel: Kernel) -> list:
    """The kernel's arguments in `params` order: a fake tensor of each tensor param (each
    size a run-time value, one for each name; the strides run-time values, multiples of the
    vector in rows of vectors) and a run-time value of each scalar's type."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    layout = fam.layout(kernel)
    vec = layout.get("vec", 1)
    vector_sizes = {p.dims[-1] for p in fam.params if p.vec}
    sizes = {}

    def size(name):
        if name not in sizes:
            sizes[name] = (cute.sym_int32(divisibility=vec, symbol=name) if name in vector_sizes
                           else cute.sym_int32(symbol=name))
        return sizes[name]

    def fake(p):
        dtype = _dsl_type(layout.get(p.dtype, p.dtype))
        strides = [cute.sym_int64(divisibility=vec) if p.vec else cute.sym_int64() for _ in p.dims[1:]]
        return make_fake_tensor(dtype, tuple(size(d) for d in p.dims), (*strides, 1),
                                assumed_align=(vec if p.vec else 1) * dtype.width // 8)

    scalar = {"int32": cutlass.Int32(1), "float32": cutlass.Float32(1.0)}
    args = []
    for p in fam.params:
        if p.kind in ("tensor", "tensor3"):
            args.append(fake(p))
        elif p.kind == "routing":
            args += [scalar[kind] for _, kind in tables.ROUTING_SCALARS]
        else:
            args.append(scalar[p.kind])
    return args
