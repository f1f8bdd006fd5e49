"""The kernel variant table: the one place that says which kernels exist.

The ahead-of-time build (aot.py) compiles every row for every vector width, output dtype
and GPU architecture below, and writes the rows into a generated C++ header that the CUDA
dispatch (csrc/) includes; tests read the table from here. This module imports nothing
but the standard library, so setup.py can read it before anything is built.

Adding a variant is one row here, plus the benchmark number that justifies it
(docs/benchmarks.md).
"""

from dataclasses import dataclass
from typing import Union

INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class Dotprod:
    """CUDA-core dot product (kernels/ll_bf16_dotprod.py): one CTA per `rows_per_cta`
    experts, all of K, `unroll` vectors per thread in flight."""

    rows_per_cta: int
    unroll: int
    threads: int = 128
    vecs = (8, 1)  # 16-byte loads, or scalar loads for any K and alignment

    def prefetch_loads(self) -> int:
        """Global loads per thread before the PDL wait in a prefetch variant."""
        return self.rows_per_cta * self.unroll


@dataclass(frozen=True)
class Mma:
    """Tensor cores (kernels/ll_bf16_mma.py): `tiles` 16-expert tiles per CTA, K split over
    the `cluster_k` CTAs of a cluster and the `warps` warps of each, `unroll` 32-element
    chunks per warp and step."""

    tiles: int
    cluster_k: int
    warps: int
    unroll: int
    vecs = (8,)  # 16-byte loads only: K % 8 == 0 and 16-byte aligned rows

    def prefetch_loads(self) -> int:
        return 2 * self.tiles * self.unroll


@dataclass(frozen=True)
class Variant:
    name: str
    m_lo: int  # the dispatch picks this row for m_lo <= M <= m_hi and n_min <= N <= n_max ...
    m_hi: int  # ... (first match wins); m_hi is also the compiled token bucket
    n_min: int
    n_max: int
    kernel: Union[Dotprod, Mma]
    prefetch: bool  # load the first weight step before the PDL grid-dependency wait
    pdl: bool  # launched with programmatic dependent launch
    automatic: bool  # False: run only when asked for by name (benchmarks, tests)


def _mma(max_m, tiles, cluster_k, warps, unroll, prefetch=True, n_min=1, n_max=INT32_MAX, automatic=False):
    name = f"mma{max_m}_t{tiles}c{cluster_k}w{warps}u{unroll}" + ("" if prefetch else "_noprefetch")
    return Variant(name, 1, max_m, n_min, n_max, Mma(tiles, cluster_k, warps, unroll),
                   prefetch=prefetch, pdl=True, automatic=automatic)


# Measured on an H200 (docs/benchmarks.md): two rows per CTA pay at N=896 (-7% at M=1) and
# cost at N<=384; m8/m16 lose to cuBLAS there (x re-read from L2 per row block), so M > 4
# goes to cuBLAS and they stay for measurement against future kernels.
VARIANTS = (
    Variant("m1_prefetch_r2", 1, 1, 512, INT32_MAX, Dotprod(2, 8), prefetch=True, pdl=True, automatic=True),
    Variant("m1_prefetch", 1, 1, 1, INT32_MAX, Dotprod(1, 8), prefetch=True, pdl=True, automatic=True),
    Variant("m1", 1, 1, 1, INT32_MAX, Dotprod(1, 8), prefetch=False, pdl=True, automatic=False),
    Variant("m1_nopdl", 1, 1, 1, INT32_MAX, Dotprod(1, 8), prefetch=False, pdl=False, automatic=False),
    Variant("m1_prefetch_r4_t256", 1, 1, 1, INT32_MAX, Dotprod(4, 4, threads=256), prefetch=True, pdl=True, automatic=False),
    Variant("m1_prefetch_r2_t512", 1, 1, 1, INT32_MAX, Dotprod(2, 2, threads=512), prefetch=True, pdl=True, automatic=False),
    Variant("m2", 2, 2, 1, INT32_MAX, Dotprod(2, 4), prefetch=False, pdl=True, automatic=True),
    Variant("m4", 3, 4, 1, INT32_MAX, Dotprod(2, 4), prefetch=False, pdl=True, automatic=True),
    Variant("m8", 5, 8, 1, INT32_MAX, Dotprod(4, 2), prefetch=False, pdl=True, automatic=False),
    Variant("m16", 9, 16, 1, INT32_MAX, Dotprod(4, 1), prefetch=False, pdl=True, automatic=False),
) + tuple(
    _mma(max_m, tiles, cluster_k, warps, unroll, prefetch)
    for max_m, tiles, cluster_k, warps, unroll, prefetch in (
        (8, 2, 4, 8, 8, True),
        (8, 2, 4, 8, 8, False),
        (8, 2, 4, 8, 7, True),
        (8, 2, 8, 4, 8, True),
        (8, 2, 8, 4, 7, True),
        (8, 1, 4, 8, 7, True),
        (8, 2, 4, 16, 4, True),
        (16, 2, 4, 8, 8, True),
        (16, 2, 4, 8, 7, True),
        (16, 2, 8, 4, 7, True),
        (16, 2, 8, 4, 8, True),
        (16, 1, 4, 8, 8, True),
        (16, 1, 4, 8, 7, True),
    )
)

# Elements per load: 8 (16-byte vectors) when K, the row strides and the data pointers
# allow it, else 1 (any K, any alignment, same kernel with scalar loads); each kernel
# family says which of them it is compiled for.
OUT_DTYPES = ("float32", "bfloat16")
# (CuTe DSL target, compute capability major*10+minor it serves)
ARCHS = (("sm_90a", 90), ("sm_100a", 100))
MAX_M = max(v.m_hi for v in VARIANTS)  # the largest M any kernel accepts


def kernel_symbol(variant: Variant, vec: int, out_dtype: str, arch: str) -> str:
    """C symbol prefix of one compiled kernel, e.g. kimi_m1_prefetch_v8_f32_sm_90a."""
    short = {"float32": "f32", "bfloat16": "bf16"}[out_dtype]
    return f"kimi_{variant.name}_v{vec}_{short}_{arch}"


def compiled_kernels():
    """Every (variant, vec, out_dtype, arch) the build compiles, in table order."""
    return [
        (v, vec, dt, arch, sm)
        for arch, sm in ARCHS
        for v in VARIANTS
        for vec in v.kernel.vecs
        for dt in OUT_DTYPES
    ]


def write_variant_table_header(path: str) -> None:
    """The rows above as a C++ array (csrc/ includes it; selection order = row order)."""
    rows = "\n".join(
        f'    {{"{v.name}", {v.m_lo}, {v.m_hi}, {v.n_min}, {v.n_max}, '
        f"{str(1 in v.kernel.vecs).lower()}, {str(v.prefetch).lower()}, "
        f"{str(v.pdl).lower()}, {str(v.automatic).lower()}}},"
        for v in VARIANTS
    )
    text = (
        "// Generated from kimi_router_ops/variants.py by setup.py. Do not edit.\n"
        "#pragma once\n"
        '#include "variant_row.h"\n\n'
        "namespace kimi {\n"
        "// inline: one array for the whole program, so row pointers compare across files.\n"
        "inline constexpr VariantRow kVariantRows[] = {\n"
        f"{rows}\n"
        "};\n"
        "}  // namespace kimi\n"
    )
    _write_if_changed(path, text)


def _write_if_changed(path: str, text: str) -> None:
    try:
        with open(path) as f:
            if f.read() == text:
                return
    except FileNotFoundError:
        pass
    with open(path, "w") as f:
        f.write(text)
