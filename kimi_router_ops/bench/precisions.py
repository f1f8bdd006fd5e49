"""python -m kimi_router_ops.bench.precisions: fp32 gates and gate biases on this GPU.

fp32 router weights (MiniMax-M2 and M3, Hunyuan-v3, Ernie-4.5, Step-3.5, Nemotron-H keep
their gate in fp32): `router_gemm` and each fp32-weight kernel against cuBLAS in fp32
(`F.linear(x.float(), w)`, vLLM's fallback), the fused fp32 router (MiniMax-M2: sigmoid +
bias, top-8) against the GEMM alone, and gpt-oss's router (bf16, with its gate bias, top-4
softmax) against the same router without the bias. Every cell is timed two ways, in CUDA
graphs of one call per weight copy (cold weights): after the layer (a non-PDL kernel over
48 MiB before each call, subtracted) and back to back. Writes <out>/precisions.json, .md.
"""

import argparse

import torch
import torch.nn.functional as F

import kimi_router_ops
from kimi_router_ops import tables
from .report import parse_bench_args, report_header, save_report, two_way_markdown
from .timing import hbm_read_bandwidth
from .timing import after_layer_timer, graph_time_us, l2_bytes

# (K, N): vLLM's fp32_router_gemm shapes (MiniMax-M2, MiniMax-M3, 6144 x 256), one it lacks,
# and a sweep of other gates.
FP32_SHAPES = ((3072, 256), (6144, 128), (6144, 256), (7168, 256))
SWEEP_SHAPES = ((2048, 64), (4096, 128), (5120, 160), (7168, 384), (4096, 512))
M_LIST = (1, 2, 4, 8, 16, 32, 64)
GPT_OSS = (2880, 128, 4)  # K, N, top_k


def fp32_gemms(m, candidates):
    """name -> fn(x, w) for fp32 weights."""
    impls = {
        "router_gemm": lambda x, w: kimi_router_ops.router_gemm(x, w),
        "cuBLAS fp32": lambda x, w: F.linear(x.float(), w),
    }
    if candidates:
        for v in tables.gemm.VARIANTS:
            if v.kernel.weight_dtype == "float32" and m <= v.max_m:
                impls[f"forced {v.name}"] = lambda x, w, name=v.name: kimi_router_ops.router_gemm_with_variant(x, w, name)
    return impls


def run(shapes, m_list, replays, candidates):
    layer_us, after_layer_us = after_layer_timer(replays)

    def both_ways(calls):
        return {"after_layer": after_layer_us(calls), "back_to_back": round(graph_time_us(calls, replays=replays), 3)}

    def copies(n, k, dtype):
        count = min(256, max(2, -(-3 * l2_bytes() // (n * k * dtype.itemsize))))
        return [(torch.randn(n, k, device="cuda") * k ** -0.5).to(dtype) for _ in range(count)]

    results = []
    for k, n in shapes:
        weights = copies(n, k, torch.float32)
        for m in m_list:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            for name, fn in fp32_gemms(m, candidates).items():
                calls = [lambda w=w, fn=fn: fn(x, w) for w in weights]
                results.append({"table": "fp32 GEMM", "shape": f"{k}x{n}", "M": m, "impl": name, **both_ways(calls)})
        del weights
    # The fused fp32 router: MiniMax-M2.
    k, n = 3072, 256
    weights = copies(n, k, torch.float32)
    biases = [torch.randn(n, device="cuda") * 0.1 for _ in weights]
    for m in [m for m in m_list if m <= 16]:
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        impls = {
            "router (fused)": lambda w, b: kimi_router_ops.router(x, w, b, 8),
            "router_gemm alone": lambda w, b: kimi_router_ops.router_gemm(x, w),
            "router_gemm + moe_routing": lambda w, b: kimi_router_ops.moe_routing(kimi_router_ops.router_gemm(x, w), b, 8),
        }
        for name, fn in impls.items():
            calls = [lambda w=w, b=b, fn=fn: fn(w, b) for w, b in zip(weights, biases)]
            results.append({"table": "MiniMax-M2 router", "shape": f"{k}x{n}", "M": m, "impl": name, **both_ways(calls)})
    # gpt-oss: bf16 gate with its bias, top-4 softmax over the chosen.
    k, n, top_k = GPT_OSS
    weights = copies(n, k, torch.bfloat16)
    gate_biases = [(torch.randn(n, device="cuda") * 0.1).to(torch.bfloat16) for _ in weights]
    for m in [m for m in m_list if m <= 16]:
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        impls = {
            "router with gate_bias": lambda w, b: kimi_router_ops.router(x, w, None, top_k, scoring="softmax", gate_bias=b),
            "router without": lambda w, b: kimi_router_ops.router(x, w, None, top_k, scoring="softmax"),
            "F.linear + topk + softmax": lambda w, b: torch.topk(F.linear(x, w, b), top_k, dim=-1)[0].softmax(-1),
        }
        for name, fn in impls.items():
            calls = [lambda w=w, b=b, fn=fn: fn(w, b) for w, b in zip(weights, gate_biases)]
            results.append({"table": "gpt-oss router", "shape": f"{k}x{n}", "M": m, "impl": name, **both_ways(calls)})
    return results, layer_us


def markdown(report):
    return two_way_markdown(
        report, f"us per call, median of CUDA-graph replays, cold weights; each cell is after the layer (back "
        f"to back). HBM read {report['hbm_tb_s']:.2f} TB/s.", "table", ("shape", "impl"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", nargs="+", type=int, default=list(M_LIST))
    parser.add_argument("--sweep", action="store_true", help="also the K x N sweep of other gates")
    parser.add_argument("--candidates", action="store_true", help="also every fp32-weight kernel, named")
    args = parse_bench_args(parser)
    shapes = FP32_SHAPES + (SWEEP_SHAPES if args.sweep else ())
    results, layer_us = run(shapes, args.m, args.replays, args.candidates)
    report = report_header(hbm_tb_s=round(hbm_read_bandwidth() / 1e12, 3), layer_us=round(layer_us, 3), results=results)
    save_report(args.out, "precisions", report, markdown(report))


if __name__ == "__main__":
    main()
