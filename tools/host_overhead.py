"""Eager host cost of one call of each op, in µs: the wall time of many back-to-back eager
calls at M = 1 (DeepSeek-V3's router shape), where the CPU, not the GPU, is the bound; the
fastest of many repeats, since the noise (other processes, clocks) only ever adds. Run it
alternately with two builds on one machine to compare them; prints one JSON object.

    python tools/host_overhead.py [--label NAME]
"""

import argparse
import contextlib
import json
import time

import torch

import kimi_router_ops as k


def per_call_us(fn, calls=500, repeats=30):
    times = []
    for _ in range(repeats):
        for _ in range(200):
            fn()
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) / calls * 1e6)
    return min(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    x = torch.randn(1, 7168, device="cuda").to(torch.bfloat16)
    w = torch.randn(256, 7168, device="cuda").to(torch.bfloat16)
    bias = torch.zeros(256, device="cuda")
    logits = torch.randn(1, 256, device="cuda")
    norm_w = torch.ones(7168, device="cuda", dtype=torch.bfloat16)
    ops = {
        "ll_bf16_gemm": lambda: k.ll_bf16_gemm(x, w),
        "torch.ops.kimi.ll_bf16_gemm": lambda: torch.ops.kimi.ll_bf16_gemm(x, w),
        "ll_bf16_router": lambda: k.ll_bf16_router(x, w, bias, 8, 8, 4, True, 2.5),
        "moe_routing": lambda: k.moe_routing(logits, bias, 8, 8, 4, True, 2.5),
        "rms_norm": lambda: k.rms_norm(x, norm_w, 1e-6),
        "fused_add_rms_norm": lambda: k.fused_add_rms_norm(x, x, norm_w, 1e-6),
        "torch.mm (for scale)": lambda: torch.mm(x, w.t()),
    }
    modes = {
        "grad enabled": contextlib.nullcontext,
        "no_grad": torch.no_grad,
        "inference_mode": torch.inference_mode,
    }
    result = {"label": args.label, "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}
    for mode, context in modes.items():
        with context():
            result[mode] = {name: round(per_call_us(fn), 2) for name, fn in ops.items()}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
