"""The kernel variant table: the one place that says which kernels exist.

The ahead-of-time build (aot.py) compiles every row for every vector width, output dtype
and GPU architecture below, and writes the rows into a generated C++ header that the CUDA
dispatch (csrc/) includes; tests read the table from here. This module imports nothing
but the standard library, so setup.py can read it before anything is built.

Adding a variant is one row here, plus the benchmark number that justifies it
(docs/benchmarks.md).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Variant:
    name: str
    m_lo: int  # the dispatch picks this row for m_lo <= M <= m_hi and N >= n_min ...
    m_hi: int  # ... (first match wins); m_hi is also the compiled token bucket
    n_min: int
    rows_per_cta: int  # weight rows (experts) per CTA
    unroll: int  # vectors per thread per K step, all loaded before the first use
    prefetch: bool  # load the first weight step before the PDL grid-dependency wait
    pdl: bool  # launched with programmatic dependent launch
    automatic: bool  # False: run only when asked for by name (benchmarks, tests)


# Measured on an H200 (docs/benchmarks.md): two rows per CTA pay at N=896 (-7% at M=1) and
# cost at N<=384; m8/m16 lose to cuBLAS there (x re-read from L2 per row block), so M > 4
# goes to cuBLAS and they stay for measurement against future kernels.
VARIANTS = (
    Variant("m1_prefetch_r2", 1, 1, 512, rows_per_cta=2, unroll=8, prefetch=True, pdl=True, automatic=True),
    Variant("m1_prefetch", 1, 1, 1, rows_per_cta=1, unroll=8, prefetch=True, pdl=True, automatic=True),
    Variant("m1", 1, 1, 1, rows_per_cta=1, unroll=8, prefetch=False, pdl=True, automatic=False),
    Variant("m1_nopdl", 1, 1, 1, rows_per_cta=1, unroll=8, prefetch=False, pdl=False, automatic=False),
    Variant("m2", 2, 2, 1, rows_per_cta=2, unroll=4, prefetch=False, pdl=True, automatic=True),
    Variant("m4", 3, 4, 1, rows_per_cta=2, unroll=4, prefetch=False, pdl=True, automatic=True),
    Variant("m8", 5, 8, 1, rows_per_cta=4, unroll=2, prefetch=False, pdl=True, automatic=False),
    Variant("m16", 9, 16, 1, rows_per_cta=4, unroll=1, prefetch=False, pdl=True, automatic=False),
)

# Elements per load: 8 (16-byte vectors) when K, the row strides and the data pointers
# allow it, else 1 (any K, any alignment, same kernel with scalar loads).
VECS = (8, 1)
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
        for vec in VECS
        for dt in OUT_DTYPES
    ]


def write_variant_table_header(path: str) -> None:
    """The rows above as a C++ array (csrc/ includes it; selection order = row order)."""
    rows = "\n".join(
        f'    {{"{v.name}", {v.m_lo}, {v.m_hi}, {v.n_min}, {str(v.prefetch).lower()}, '
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
