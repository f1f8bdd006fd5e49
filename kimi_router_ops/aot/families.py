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
    """One argument of an exported kernel: a "tensor" (rank 2: two sizes, one row stride), a
    "tensor3" (rank 3), an "int32", a "float32", or "routing" (the ROUTING_SCALARS)."""

    name: str
    kind: str


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
    lists what one architecture compiles; `compile` gives a kernel's CuTe DSL object and its
    fake tensors by parameter name."""

    name: str
    params: tuple
    fields: tuple
    kernels: Callable[[str, int], list]
    compile: Callable[[Kernel], tuple]


def _params(spec: str) -> tuple:
    """'x w:tensor has_gate_bias:int32' -> Params; a name without a kind takes the next one's."""
    params, pending = [], []
    for word in spec.split():
        name, _, kind = word.partition(":")
        pending.append(name)
        if kind:
            params += [Param(n, kind) for n in pending]
            pending = []
    assert not pending, spec
    return tuple(params)


_SHORT = {"float32": "f32", "bfloat16": "bf16"}
SCALAR_TYPES = {"float32": "c10::ScalarType::Float", "bfloat16": "c10::ScalarType::BFloat16"}


def _dsl_type(dtype: str):
    import cutlass

    return {"float32": cutlass.Float32, "bfloat16": cutlass.BFloat16}[dtype]


def _row_major(dtype: str, shape, align=None):
    """A fake row-major rank-2 tensor: run-time sizes and row stride."""
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    t = _dsl_type(dtype) if isinstance(dtype, str) else dtype
    return make_fake_tensor(t, shape, (cute.sym_int64(), 1), assumed_align=align or t.width // 8)


def _gemm_tensors(vec: int, x_dtype: str, weight_dtype: str, out_dtype: str) -> dict:
    """x [M, K], w [N, K], gate_bias [1, N] (w's dtype), out [M, N]: every size and row stride
    a run-time value, K and the strides multiples of `vec`."""
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    m, n = cute.sym_int32(symbol="M"), cute.sym_int32(symbol="N")
    k = cute.sym_int32(divisibility=vec, symbol="K")

    def operand(dtype, rows):
        t = _dsl_type(dtype)
        return make_fake_tensor(t, (rows, k), (cute.sym_int64(divisibility=vec), 1), assumed_align=vec * t.width // 8)

    return {"x": operand(x_dtype, m), "w": operand(weight_dtype, n),
            "gate_bias": _row_major(weight_dtype, (cute.sym_int32(symbol="ONE"), n)),
            "out": _row_major(out_dtype, (m, n))}


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
    return gemm_object(k.row, k.vec, k.x_dtype), _gemm_tensors(k.vec, k.x_dtype, k.row.kernel.weight_dtype,
                                                               k.out_dtype)


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


def _routing_outputs(m, n, bias_dtype):
    """bias [1, N], weights and ids [M, top_k] (ids as int32 words); a hash-routed call's
    input_ids [1, M x words] and hash_table [V, top_k x words] as int32 words; the expert counts
    [1, N + shared experts]."""
    import cutlass
    import cutlass.cute as cute

    top_k, one = cute.sym_int32(symbol="TOPK"), cute.sym_int32(symbol="ONE")
    return {"bias": _row_major(bias_dtype, (one, n)),
            "weights": _row_major(cutlass.Float32, (m, top_k)), "ids": _row_major(cutlass.Int32, (m, top_k)),
            "input_ids": _row_major(cutlass.Int32, (one, cute.sym_int32(symbol="IDS"))),
            "hash_table": _row_major(cutlass.Int32, (cute.sym_int32(symbol="V"), cute.sym_int32(symbol="C"))),
            "counts": _row_major(cutlass.Int32, (one, cute.sym_int32(symbol="NS")))}


def _compile_router(k):
    import cutlass
    import cutlass.cute as cute

    weight_dtype = k.row.weight_dtype
    tensors = _gemm_tensors(8 if weight_dtype == "bfloat16" else 4, "bfloat16", weight_dtype, "float32")
    tensors["logits"] = tensors.pop("out")
    m, n = cute.sym_int32(symbol="M"), tensors["w"].shape[0]
    tensors.update(_routing_outputs(m, n, k.bias_dtype), handoff=_row_major(cutlass.Int32, (m, n)))
    return router_object(k.row), tensors


# -- the gate and a projection -------------------------------------------------------------


def _projection_kernels(arch, sm):
    return [Kernel("Projection", row, arch, sm, f"kimi_{row.name}_{arch}") for row in tables.projection.PROJECTION_KERNELS]


def _compile_projection(k):
    from ..kernels.gate_projection import GateProjection

    tensors = _gemm_tensors(8, "bfloat16", "bfloat16", "float32")
    tensors["logits"] = tensors.pop("out")
    projection = _gemm_tensors(8, "bfloat16", "bfloat16", "bfloat16")
    tensors.update(p=projection["w"], projection=projection["out"])
    row = k.row
    return GateProjection(row.m_hi, row.rows, row.unroll, row.threads, row.ctas_per_sm), tensors


# -- routing --------------------------------------------------------------------------------


def _routing_kernels(arch, sm):
    return [Kernel("Routing", row, arch, sm,
                   f"kimi_moe_routing_n{row.n_max}_{_SHORT[row.logits_dtype]}_{_SHORT[row.bias_dtype]}_{arch}")
            for row in tables.routing.ROUTING_KERNELS]


def _compile_routing(k):
    import cutlass.cute as cute

    from ..kernels.moe_routing import MoeRouting

    m, n = cute.sym_int32(symbol="M"), cute.sym_int32(symbol="N")
    tensors = {"logits": _row_major(k.row.logits_dtype, (m, n)), **_routing_outputs(m, n, k.row.bias_dtype)}
    return MoeRouting(k.row.n_max, tables.routing.ROUTING_WARPS), tensors


# -- norms ----------------------------------------------------------------------------------


def _norm_kernels(arch, sm):
    return [Kernel("Norm", row, arch, sm, f"kimi_{row.op}_v{row.vec}_{arch}") for row in tables.norm.NORM_KERNELS]


def _compile_norm(k):
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    from ..kernels.rms_norm import RmsNorm

    vec = k.row.vec
    m, kk = cute.sym_int32(symbol="M"), cute.sym_int32(divisibility=vec, symbol="K")

    def fake(rows):
        return make_fake_tensor(cutlass.BFloat16, (rows, kk), (cute.sym_int64(divisibility=vec), 1),
                                assumed_align=2 * vec)

    tensors = {"x": fake(m), "residual": fake(m), "weight": fake(cute.sym_int32(symbol="ONE")), "out": fake(m),
               "residual_out": fake(m)}
    kernel = RmsNorm(vec, k.row.op == "fused_add_rms_norm", k.row.threads, k.row.unroll)
    return kernel, tensors


# -- AttnRes --------------------------------------------------------------------------------


def _attn_res_kernels(arch, sm):
    return [Kernel("AttnRes", tables.attn_res.ATTN_RES_KERNEL, arch, sm, f"kimi_attn_res_{arch}")]


def _compile_attn_res(k):
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    from ..kernels.attn_res import AttnRes

    m, h = cute.sym_int32(symbol="M"), cute.sym_int32(divisibility=8, symbol="H")

    def fake(rows):
        return make_fake_tensor(cutlass.BFloat16, (rows, h), (cute.sym_int64(divisibility=8), 1), assumed_align=16)

    blocks = make_fake_tensor(cutlass.BFloat16, (m, cute.sym_int32(symbol="R"), h),
                              (cute.sym_int64(divisibility=8), cute.sym_int64(divisibility=8), 1), assumed_align=16)
    one = cute.sym_int32(symbol="ONE")
    tensors = {"prefix": fake(m), "delta": fake(m), "blocks": blocks, "norm_weight": fake(one),
               "qk_weight": fake(one), "output_norm_weight": fake(one), "out": fake(m)}
    row = k.row
    return AttnRes(row.cluster, row.threads, row.max_blocks), tensors


def _index(rows, row) -> str:
    return str(rows.index(row))


FAMILIES = (
    Family("Gemm", _params("x w gate_bias out:tensor has_gate_bias:int32"),
           (("int", "variant", "", lambda k: _index(tables.gemm.ALL_VARIANTS, k.row)), ("int", "vec", "", lambda k: str(k.vec)),
            ("c10::ScalarType", "x_dtype", "", lambda k: SCALAR_TYPES[k.x_dtype]),
            ("c10::ScalarType", "out_dtype", "", lambda k: SCALAR_TYPES[k.out_dtype])),
           _gemm_kernels, _compile_gemm),
    Family("Router", _params("x w gate_bias bias logits weights ids handoff input_ids hash_table counts:tensor "
                             "routing:routing has_gate_bias:int32"),
           (("int", "router", "", lambda k: _index(tables.router.ROUTER_VARIANTS, k.row)),
            ("c10::ScalarType", "bias_dtype", "", lambda k: SCALAR_TYPES[k.bias_dtype])),
           _router_kernels, _compile_router),
    Family("Projection", _params("x w gate_bias logits p projection:tensor has_gate_bias ctas:int32"),
           (("int", "m_lo", "", lambda k: str(k.row.m_lo)), ("int", "m_hi", "", lambda k: str(k.row.m_hi)),
            ("int", "ctas_per_sm", "", lambda k: str(k.row.ctas_per_sm)), ("int64_t", "max_k", "", lambda k: str(k.row.max_k))),
           _projection_kernels, _compile_projection),
    Family("Routing", _params("logits bias weights ids input_ids hash_table counts:tensor routing:routing"),
           (("int", "n_min", "", lambda k: str(k.row.n_min)), ("int", "n_max", "", lambda k: str(k.row.n_max)),
            ("c10::ScalarType", "logits_dtype", "", lambda k: SCALAR_TYPES[k.row.logits_dtype]),
            ("c10::ScalarType", "bias_dtype", "", lambda k: SCALAR_TYPES[k.row.bias_dtype])),
           _routing_kernels, _compile_routing),
    Family("Norm", _params("x residual weight out residual_out:tensor eps:float32"),
           (("bool", "add_residual", "", lambda k: str(k.row.op == "fused_add_rms_norm").lower()),
            ("int", "vec", "", lambda k: str(k.row.vec))),
           _norm_kernels, _compile_norm),
    Family("AttnRes", _params("prefix delta:tensor blocks:tensor3 norm_weight qk_weight output_norm_weight out:tensor "
                              "num_blocks block_write_idx has_delta has_output_norm:int32 eps output_norm_eps:float32"),
           (), _attn_res_kernels, _compile_attn_res),
)


def compiled_kernels(name: str = "", arch: str = "") -> list:
    """Every kernel the build compiles (of one family, for one architecture), in table order."""
    return [k for f in FAMILIES if name in ("", f.name) for a, sm in tables.ARCHS if arch in ("", a)
            for k in f.kernels(a, sm)]


def fake_arguments(fam: Family, tensors: dict) -> list:
    """The kernel's arguments in `params` order: the fake tensors, then a run-time value of
    each scalar's type."""
    import cutlass

    scalar = {"int32": cutlass.Int32(1), "float32": cutlass.Float32(1.0)}
    args = []
    for p in fam.params:
        if p.kind in ("tensor", "tensor3"):
            args.append(tensors.pop(p.name))
        elif p.kind == "routing":
            args += [scalar[kind] for _, kind in tables.ROUTING_SCALARS]
        else:
            args.append(scalar[p.kind])
    assert not tensors, f"{fam.name}: fake tensors without a parameter: {sorted(tensors)}"
    return args
