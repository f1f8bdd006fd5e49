"""Ahead-of-time build: compile every kernel of the variant table and export it to C.

    python kimi_router_ops/aot.py --out build/aot

For each (variant, vec, out dtype, arch), (router variant, bias dtype, arch), (routing
kernel, arch), (norm kernel, arch) and (AttnRes kernel, arch), this
writes <out>/<arch>/<symbol>.{o,h,ptx}: the host launch shim and embedded cubin (.o), its C
interface (.h) and the PTX (for the static checks in tests/test_dispatch.py). It then writes <out>/kimi_kernels.h, the table the CUDA
dispatch links against, and copies the CuTe DSL static runtime next to it. Compilation runs
on fake tensors, so no GPU is needed. setup.py runs this; a GPU machine without
nvidia-cutlass-dsl can build the extension from a copied <out> (KIMI_ROUTER_OPS_AOT_DIR).
"""

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

# This runs before the package (and its _C) exists, so it imports its siblings directly.
sys.path.insert(0, str(Path(__file__).resolve().parent))

import variants  # noqa: E402

RUNTIME_LIB = "libcuda_dialect_runtime_static.a"


def _dsl_type(dtype: str):
    import cutlass

    return {"float32": cutlass.Float32, "bfloat16": cutlass.BFloat16}[dtype]


def fake_gemm_tensors(vec: int, x_dtype: str, weight_dtype: str, out_dtype: str):
    """Fake x [M, K], w [N, K], gate_bias [1, N] (w's dtype), out [M, N]: every size and row
    stride is a run-time value."""
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    m, n = cute.sym_int32(symbol="M"), cute.sym_int32(symbol="N")
    k = cute.sym_int32(divisibility=vec, symbol="K")

    def operand(dtype, rows):
        t = _dsl_type(dtype)
        return make_fake_tensor(t, (rows, k), (cute.sym_int64(divisibility=vec), 1), assumed_align=vec * t.width // 8)

    def row_major(dtype, shape):
        t = _dsl_type(dtype)
        return make_fake_tensor(t, shape, (cute.sym_int64(), 1), assumed_align=t.width // 8)

    gate_bias = row_major(weight_dtype, (cute.sym_int32(symbol="ONE"), n))
    return operand(x_dtype, m), operand(weight_dtype, n), gate_bias, row_major(out_dtype, (m, n))


def fake_arguments(vec: int, x_dtype: str, weight_dtype: str, out_dtype: str):
    """A GEMM kernel's arguments: x, w, gate_bias, out and has_gate_bias."""
    import cutlass

    return [*fake_gemm_tensors(vec, x_dtype, weight_dtype, out_dtype), cutlass.Int32(0)]


def fake_router_arguments(weight_dtype: str, bias_dtype: str):
    """Fake x, w, gate_bias, bias [1, N], logits [M, N], weights and ids [M, top_k], handoff
    [M, N] and the routing scalars: all sizes and row strides are run-time values."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    vec = 8 if weight_dtype == "bfloat16" else 4
    x, w, gate_bias, logits = fake_gemm_tensors(vec, "bfloat16", weight_dtype, "float32")
    m, n, top_k = cute.sym_int32(symbol="M"), w.shape[0], cute.sym_int32(symbol="TOPK")
    bias_type = {"float32": cutlass.Float32, "bfloat16": cutlass.BFloat16}[bias_dtype]

    def fake(dtype, shape):
        return make_fake_tensor(dtype, shape, (cute.sym_int64(), 1), assumed_align=4 if dtype.width == 32 else 2)

    bias = fake(bias_type, (cute.sym_int32(symbol="ONE"), n))
    weights, ids = fake(cutlass.Float32, (m, top_k)), fake(cutlass.Int32, (m, top_k))
    handoff = fake(cutlass.Int32, (m, n))
    # top_k .. softmax, scaling, has_gate_bias
    scalars = [cutlass.Int32(1)] * 6 + [cutlass.Float32(1.0), cutlass.Int32(0)]
    return [x, w, gate_bias, bias, logits, weights, ids, handoff, *scalars]


def fake_routing_arguments(logits_dtype: str, bias_dtype: str):
    """Fake logits [M, N], bias [1, N], weights and ids [M, top_k] and the routing scalars."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    m, n, top_k = cute.sym_int32(symbol="M"), cute.sym_int32(symbol="N"), cute.sym_int32(symbol="TOPK")
    dtype = {"float32": cutlass.Float32, "bfloat16": cutlass.BFloat16}

    def fake(element, shape):
        return make_fake_tensor(element, shape, (cute.sym_int64(), 1), assumed_align=element.width // 8)

    logits = fake(dtype[logits_dtype], (m, n))
    bias = fake(dtype[bias_dtype], (cute.sym_int32(symbol="ONE"), n))
    weights, ids = fake(cutlass.Float32, (m, top_k)), fake(cutlass.Int32, (m, top_k))
    scalars = [cutlass.Int32(1)] * 6 + [cutlass.Float32(1.0)]  # top_k .. softmax, scaling
    return [logits, bias, weights, ids, *scalars]


def fake_norm_arguments(vec: int):
    """Fake x, residual [M, K], weight [1, K], out, residual_out [M, K] and eps."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    m, k = cute.sym_int32(symbol="M"), cute.sym_int32(divisibility=vec, symbol="K")

    def fake(rows):
        return make_fake_tensor(
            cutlass.BFloat16, (rows, k), (cute.sym_int64(divisibility=vec), 1), assumed_align=2 * vec
        )

    return [fake(m), fake(m), fake(cute.sym_int32(symbol="ONE")), fake(m), fake(m), cutlass.Float32(1e-6)]


def fake_attn_res_arguments():
    """Fake prefix, delta [M, H], blocks [M, R, H], the three weights [1, H], out [M, H] and
    the scalars: every size and stride but the last is a run-time value."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_tensor

    m, h = cute.sym_int32(symbol="M"), cute.sym_int32(divisibility=8, symbol="H")

    def fake(rows):
        return make_fake_tensor(cutlass.BFloat16, (rows, h), (cute.sym_int64(divisibility=8), 1), assumed_align=16)

    blocks = make_fake_tensor(cutlass.BFloat16, (m, cute.sym_int32(symbol="R"), h),
                              (cute.sym_int64(divisibility=8), cute.sym_int64(divisibility=8), 1), assumed_align=16)
    one = cute.sym_int32(symbol="ONE")
    scalars = [cutlass.Int32(1)] * 4 + [cutlass.Float32(1e-6)] * 2  # num_blocks .. has_output_norm, eps x 2
    return [fake(m), fake(m), blocks, fake(one), fake(one), fake(one), fake(m), *scalars]


def kernel_object(variant, vec, x_dtype="bfloat16", trigger=None):
    """The kernel class of the variant's family, with the variant's compile-time parameters
    (and its trigger point unless another is given: a fused router row's own)."""
    from dataclasses import asdict

    from kernels.ll_bf16_dotprod import LLBf16Dotprod
    from kernels.ll_bf16_mma import LLBf16Mma

    family = {variants.Dotprod: LLBf16Dotprod, variants.Mma: LLBf16Mma}[type(variant.kernel)]
    params = asdict(variant.kernel)
    if family is LLBf16Dotprod:
        params.update(vec=vec, max_m=variant.m_hi, weight_dtype=_dsl_type(params["weight_dtype"]),
                      x_dtype=_dsl_type(x_dtype))
    return family(prefetch=variant.prefetch, pdl=variant.pdl, trigger=trigger or variant.trigger, **params)


def router_object(router):
    from kernels.ll_bf16_router import LLBf16Router

    gemm_row = variants.variant(router.gemm)
    gemm = kernel_object(gemm_row, gemm_row.kernel.vecs[0], trigger=router.trigger)
    return LLBf16Router(gemm, n_max=router.n_max, exclusive=router.exclusive,
                        bias_prefetch=router.bias_prefetch, at_publisher=router.at_publisher)


def compile_kernel(variant, vec, x_dtype, out_dtype, arch, out_dir: Path) -> str:
    symbol = variants.kernel_symbol(variant, vec, x_dtype, out_dtype, arch)
    export(kernel_object(variant, vec, x_dtype),
           fake_arguments(vec, x_dtype, variant.kernel.weight_dtype, out_dtype), symbol, arch, out_dir)
    return symbol


def compile_router_kernel(router, bias_dtype, arch, out_dir: Path) -> str:
    symbol = variants.router_kernel_symbol(router, bias_dtype, arch)
    export(router_object(router), fake_router_arguments(router.weight_dtype, bias_dtype), symbol, arch, out_dir)
    return symbol


def compile_routing_kernel(kernel, arch, out_dir: Path) -> str:
    from kernels.moe_routing import MoeRouting

    symbol = variants.routing_kernel_symbol(kernel, arch)
    export(MoeRouting(kernel.n_max, variants.ROUTING_WARPS),
           fake_routing_arguments(kernel.logits_dtype, kernel.bias_dtype), symbol, arch, out_dir)
    return symbol


def compile_norm_kernel(norm, arch, out_dir: Path) -> str:
    from kernels.rms_norm import RmsNorm

    symbol = variants.norm_kernel_symbol(norm, arch)
    kernel = RmsNorm(norm.vec, norm.op == "fused_add_rms_norm", norm.threads, norm.unroll)
    export(kernel, fake_norm_arguments(norm.vec), symbol, arch, out_dir)
    return symbol


def compile_attn_res_kernel(arch, out_dir: Path) -> str:
    from kernels.attn_res import AttnRes

    k = variants.ATTN_RES_KERNEL
    symbol = variants.attn_res_kernel_symbol(arch)
    export(AttnRes(k.cluster, k.threads, k.max_blocks), fake_attn_res_arguments(), symbol, arch, out_dir)
    return symbol


def export(kernel, arguments, symbol, arch, out_dir: Path) -> None:
    import cuda.bindings.driver as cuda
    import cutlass.cute as cute

    compiled = cute.compile(kernel, *arguments, cuda.CUstream(0), options="--keep-ptx")
    arch_dir = out_dir / arch
    arch_dir.mkdir(parents=True, exist_ok=True)
    compiled.export_to_c(str(arch_dir), symbol, symbol)
    # With --keep-ptx, __ptx__ is the PTX text (or, if the dump was not written, its intended
    # path in CUTE_DSL_DUMP_DIR, a name shared by all variants: never trust a stale one).
    ptx = compiled.__ptx__
    if not ptx or ".entry" not in ptx:
        raise RuntimeError(f"no PTX for {symbol} (CUTE_DSL_DUMP_DIR must exist)")
    (arch_dir / f"{symbol}.ptx").write_text(ptx)


def kernel_table_header(kernels, router_kernels, routing_kernels, norm_kernels, archs) -> str:
    """C++ glue over the exported headers: one launch adapter and one table row a kernel."""
    includes, adapters, rows = [], [], []
    index = {v.name: i for i, v in enumerate(variants.VARIANTS)}
    for variant, vec, x_dtype, out_dtype, arch, sm in kernels:
        s = variants.kernel_symbol(variant, vec, x_dtype, out_dtype, arch)
        includes.append(f'#include "{arch}/{s}.h"')
        casts = ", ".join(f"reinterpret_cast<{s}_Tensor_{t}_t*>(&a->{t})" for t in ("x", "w", "gate_bias", "out"))
        adapters.append(
            f"inline int32_t launch_{s}(GemmArgs* a, cudaStream_t stream) {{\n"
            f"  static_assert(sizeof({s}_Tensor_x_t) == sizeof(TensorArg), \"ABI mismatch\");\n"
            f"  static_assert(sizeof({s}_Tensor_out_t) == sizeof(TensorArg), \"ABI mismatch\");\n"
            f"  return cute_dsl_{s}_wrapper(nullptr, {casts}, a->has_gate_bias, stream);\n"
            f"}}"
        )
        rows.append(
            f'    {{"{s}", {index[variant.name]}, {vec}, {variants.SCALAR_TYPES[x_dtype]}, '
            f"{variants.SCALAR_TYPES[out_dtype]}, {sm}, "
            f"_mlir_{s}_cuda_init, _mlir_{s}_cuda_load_to_device, launch_{s}}},"
        )
    router_index = {r.name: i for i, r in enumerate(variants.ROUTER_VARIANTS)}
    router_rows = []
    for router, bias_dtype, arch, sm in router_kernels:
        s = variants.router_kernel_symbol(router, bias_dtype, arch)
        includes.append(f'#include "{arch}/{s}.h"')
        casts = ", ".join(
            f"reinterpret_cast<{s}_Tensor_{t}_t*>(&a->{t})"
            for t in ("x", "w", "gate_bias", "bias", "logits", "weights", "ids", "handoff")
        )
        adapters.append(
            f"inline int32_t launch_{s}(RouterArgs* a, cudaStream_t stream) {{\n"
            f"  static_assert(sizeof({s}_Tensor_bias_t) == sizeof(TensorArg), \"ABI mismatch\");\n"
            f"  return cute_dsl_{s}_wrapper(nullptr, {casts},\n"
            f"      a->top_k, a->n_group, a->topk_group, a->renormalize, a->has_bias, a->softmax, a->scaling,\n"
            f"      a->has_gate_bias, stream);\n"
            f"}}"
        )
        dtype = variants.SCALAR_TYPES[bias_dtype]
        router_rows.append(
            f'    {{"{s}", {router_index[router.name]}, {dtype}, {sm}, '
            f"_mlir_{s}_cuda_init, _mlir_{s}_cuda_load_to_device, launch_{s}}},"
        )
    routing_rows = []
    for kernel, arch, sm in routing_kernels:
        s = variants.routing_kernel_symbol(kernel, arch)
        includes.append(f'#include "{arch}/{s}.h"')
        casts = ", ".join(
            f"reinterpret_cast<{s}_Tensor_{t}_t*>(&a->{t})" for t in ("logits", "bias", "weights", "ids")
        )
        adapters.append(
            f"inline int32_t launch_{s}(RoutingArgs* a, cudaStream_t stream) {{\n"
            f"  static_assert(sizeof({s}_Tensor_logits_t) == sizeof(TensorArg), \"ABI mismatch\");\n"
            f"  return cute_dsl_{s}_wrapper(nullptr, {casts},\n"
            f"      a->top_k, a->n_group, a->topk_group, a->renormalize, a->has_bias, a->softmax, a->scaling, stream);\n"
            f"}}"
        )
        dtype = variants.SCALAR_TYPES
        routing_rows.append(
            f'    {{"{s}", {kernel.n_min}, {kernel.n_max}, {dtype[kernel.logits_dtype]}, {dtype[kernel.bias_dtype]}, '
            f"{sm}, _mlir_{s}_cuda_init, _mlir_{s}_cuda_load_to_device, launch_{s}}},"
        )
    norm_rows = []
    for norm, arch, sm in norm_kernels:
        s = variants.norm_kernel_symbol(norm, arch)
        includes.append(f'#include "{arch}/{s}.h"')
        casts = ", ".join(
            f"reinterpret_cast<{s}_Tensor_{t}_t*>(&a->{t})"
            for t in ("x", "residual", "weight", "out", "residual_out")
        )
        adapters.append(
            f"inline int32_t launch_{s}(NormArgs* a, cudaStream_t stream) {{\n"
            f"  static_assert(sizeof({s}_Tensor_x_t) == sizeof(TensorArg), \"ABI mismatch\");\n"
            f"  return cute_dsl_{s}_wrapper(nullptr, {casts}, a->eps, stream);\n"
            f"}}"
        )
        add = str(norm.op == "fused_add_rms_norm").lower()
        norm_rows.append(
            f'    {{"{s}", {add}, {norm.vec}, {sm}, '
            f"_mlir_{s}_cuda_init, _mlir_{s}_cuda_load_to_device, launch_{s}}},"
        )
    attn_res_rows = []
    for arch, sm in archs:
        s = variants.attn_res_kernel_symbol(arch)
        includes.append(f'#include "{arch}/{s}.h"')
        casts = ", ".join(
            f"reinterpret_cast<{s}_Tensor_{t}_t*>(&a->{t})"
            for t in ("prefix", "delta", "blocks", "norm_weight", "qk_weight", "output_norm_weight", "out")
        )
        adapters.append(
            f"inline int32_t launch_{s}(AttnResArgs* a, cudaStream_t stream) {{\n"
            f"  static_assert(sizeof({s}_Tensor_prefix_t) == sizeof(TensorArg), \"ABI mismatch\");\n"
            f"  static_assert(sizeof({s}_Tensor_blocks_t) == sizeof(Tensor3Arg), \"ABI mismatch\");\n"
            f"  return cute_dsl_{s}_wrapper(nullptr, {casts},\n"
            f"      a->num_blocks, a->block_write_idx, a->has_delta, a->has_output_norm, a->eps,\n"
            f"      a->output_norm_eps, stream);\n"
            f"}}"
        )
        attn_res_rows.append(f'    {{"{s}", {sm}, _mlir_{s}_cuda_init, _mlir_{s}_cuda_load_to_device, launch_{s}}},')
    return (
        "// Generated by kimi_router_ops/aot.py. Do not edit.\n"
        "#pragma once\n"
        '#include "kernel_abi.h"\n'
        + "\n".join(includes)
        + "\n\nnamespace kimi {\n\n"
        + "\n\n".join(adapters)
        + "\n\ninline constexpr CompiledKernel kCompiledKernels[] = {\n"
        + "\n".join(rows)
        + "\n};\n\ninline constexpr CompiledRouterKernel kCompiledRouterKernels[] = {\n"
        + "\n".join(router_rows)
        + "\n};\n\ninline constexpr CompiledRoutingKernel kCompiledRoutingKernels[] = {\n"
        + "\n".join(routing_rows)
        + "\n};\n\ninline constexpr CompiledNormKernel kCompiledNormKernels[] = {\n"
        + "\n".join(norm_rows)
        + "\n};\n\ninline constexpr CompiledAttnResKernel kCompiledAttnResKernels[] = {\n"
        + "\n".join(attn_res_rows)
        + "\n};\n\n}  // namespace kimi\n"
    )


def runtime_library() -> Path:
    import nvidia_cutlass_dsl

    for root in nvidia_cutlass_dsl.__path__:
        lib = Path(root) / "cu13" / "lib" / RUNTIME_LIB
        if lib.exists():
            return lib
    raise FileNotFoundError(
        f"{RUNTIME_LIB} not found: install the CUDA 13 libraries, pip install 'nvidia-cutlass-dsl[cu13]'"
    )


def build_arch(out_dir: Path, arch: str) -> None:
    """Compile one architecture's kernels (CuTe DSL reads the target from CUTE_DSL_ARCH)."""
    shutil.rmtree(out_dir / arch, ignore_errors=True)  # no objects of since-removed variants
    Path(os.environ["CUTE_DSL_DUMP_DIR"]).mkdir(parents=True, exist_ok=True)  # PTX lands here
    families = {
        "GEMM": [lambda k=k: compile_kernel(*k[:5], out_dir)
                 for k in variants.compiled_kernels() if k[4] == arch],
        "fused router": [lambda r=r: compile_router_kernel(*r[:3], out_dir)
                         for r in variants.compiled_router_kernels() if r[2] == arch],
        "routing": [lambda k=k: compile_routing_kernel(k[0], arch, out_dir)
                    for k in variants.compiled_routing_kernels() if k[1] == arch],
        "norm": [lambda k=k: compile_norm_kernel(k[0], arch, out_dir)
                 for k in variants.compiled_norm_kernels() if k[1] == arch],
        "attn_res": [lambda: compile_attn_res_kernel(arch, out_dir)],
    }
    counts = ", ".join(f"{len(jobs)} {family}" for family, jobs in families.items())
    print(f"[aot {arch}] compiling {sum(len(j) for j in families.values())} kernels ({counts})", flush=True)
    start = time.time()
    for family, jobs in families.items():
        for job in jobs:
            job()
        print(f"[aot {arch}] {len(jobs)} {family} kernels done, {time.time() - start:.0f} s", flush=True)


def build(out_dir: Path) -> None:
    """All architectures, one child process each (in parallel), then the table header."""
    out_dir.mkdir(parents=True, exist_ok=True)
    children = []
    for arch, _ in variants.ARCHS:
        # No compile cache: a cache hit skips writing the PTX that the static check reads.
        env = dict(
            os.environ,
            CUTE_DSL_ARCH=arch,
            CUTE_DSL_DUMP_DIR=str(out_dir / "dump" / arch),
            CUTE_DSL_NO_CACHE="1",
        )
        cmd = [sys.executable, __file__, "--out", str(out_dir), "--arch", arch]
        children.append((arch, subprocess.Popen(cmd, env=env)))
    failed = [arch for arch, child in children if child.wait() != 0]
    if failed:
        raise SystemExit(f"ahead-of-time compilation failed for {', '.join(failed)}")
    (out_dir / "kimi_kernels.h").write_text(
        kernel_table_header(
            variants.compiled_kernels(), variants.compiled_router_kernels(), variants.compiled_routing_kernels(),
            variants.compiled_norm_kernels(), variants.ARCHS,
        )
    )
    shutil.copy2(runtime_library(), out_dir / RUNTIME_LIB)
    shutil.rmtree(out_dir / "dump", ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--arch", help="compile only this architecture (internal)")
    args = parser.parse_args()
    if args.arch:
        build_arch(args.out.resolve(), args.arch)
    else:
        build(args.out.resolve())


if __name__ == "__main__":
    main()
