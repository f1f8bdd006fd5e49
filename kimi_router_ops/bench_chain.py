"""python -m kimi_router_ops.bench_chain: producer -> router latency, the case PDL is for.

The producer is an RMSNorm over hidden_states [M, K] written in Triton, launched with PDL,
which waits on its own predecessor and then lets its dependents launch at once. The router
follows it in the same stream, so a PDL router can launch while the RMSNorm runs, and the
prefetch variant can already be loading its weights. One CUDA graph holds one
(RMSNorm, router) pair per distinct weight copy (cold L2); the result is the median time
per pair. Compared: prefetch (the whole first step, and windows of 1, 2, 4 and 8 of its 16
loads per thread), no prefetch, PDL off, cuBLAS (torch.mm fp32 out), and the RMSNorm alone.
"""

import argparse

import torch

import kimi_router_ops
from kimi_router_ops.bench import SHAPES, git_commit, parse_bench_args, save_report
from kimi_router_ops.timing import graph_time_us, l2_bytes, weight_copies


def rms_norm_pdl():
    import triton
    import triton.language as tl
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

    @triton.jit
    def kernel(x_ptr, gamma_ptr, out_ptr, K: tl.constexpr, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        gdc_wait()  # our input comes from the kernel before us
        gdc_launch_dependents()  # the router may launch now (it waits for our output itself)
        offs = tl.arange(0, BLOCK)
        mask = offs < K
        x = tl.load(x_ptr + row * K + offs, mask=mask, other=0.0).to(tl.float32)
        scale = tl.rsqrt(tl.sum(x * x, axis=0) / K + eps)
        gamma = tl.load(gamma_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * K + offs, (x * scale * gamma).to(tl.bfloat16), mask=mask)

    def run(x, gamma, out):
        m, k = x.shape
        kernel[(m,)](x, gamma, out, k, 1e-6, BLOCK=triton.next_power_of_2(k), num_warps=8,
                     launch_pdl=True)
        return out

    return run


ROUTERS = {
    "prefetch (auto)": lambda h, w: kimi_router_ops.ll_bf16_gemm(h, w),
    "previous prefetch kernel (m1_prefetch)": lambda h, w: kimi_router_ops.ll_bf16_gemm_with_variant(h, w, "m1_prefetch"),
    **{
        f"prefetch window {n} (m1_prefetch_r4_t256_w{n})": (
            lambda h, w, n=n: kimi_router_ops.ll_bf16_gemm_with_variant(h, w, f"m1_prefetch_r4_t256_w{n}")
        )
        for n in (1, 2, 4, 8)
    },
    "no prefetch (m1_r4_t256)": lambda h, w: kimi_router_ops.ll_bf16_gemm_with_variant(h, w, "m1_r4_t256"),
    "PDL off (m1_r4_t256_nopdl)": lambda h, w: kimi_router_ops.ll_bf16_gemm_with_variant(h, w, "m1_r4_t256_nopdl"),
    "cuBLAS (torch.mm fp32)": lambda h, w: torch.mm(h, w.t(), out_dtype=torch.float32),
}


def run(shapes, replays):
    norm = rms_norm_pdl()
    results = []
    for shape in shapes:
        n, k = SHAPES[shape]
        x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
        gamma = torch.rand(k, device="cuda").to(torch.bfloat16)
        hidden = torch.empty_like(x)
        weights = weight_copies(n, k, 3 * l2_bytes())
        norm(x, gamma, hidden)
        ref = hidden.double() @ weights[0].double().t()
        for name, router in ROUTERS.items():
            err = ((router(hidden, weights[0]).double() - ref).norm() / ref.norm()).item()
            assert err < 1e-5, (name, err)
        norm_us = graph_time_us([lambda: norm(x, gamma, hidden)] * len(weights), replays=replays)
        results.append({"shape": shape, "impl": "RMSNorm alone", "us": round(norm_us, 3)})
        for name, router in ROUTERS.items():
            calls = [lambda w=w, r=router: (norm(x, gamma, hidden), r(hidden, w)) for w in weights]
            results.append({"shape": shape, "impl": name, "us": round(graph_time_us(calls, replays=replays), 3)})
    return results


def markdown(report):
    lines = [
        f"{report['gpu']}, torch {report['torch']}, commit {report['commit']}: RMSNorm [1, K] -> "
        "router, M=1, us per pair (median of graph replays, cold L2)",
        "",
        "| shape | " + " | ".join(dict.fromkeys(r["impl"] for r in report["results"])) + " | prefetch vs no prefetch |",
        "|---" * (2 + len(ROUTERS) + 1) + "|",
    ]
    for shape in dict.fromkeys(r["shape"] for r in report["results"]):
        rows = {r["impl"]: r["us"] for r in report["results"] if r["shape"] == shape}
        change = rows["prefetch (auto)"] / rows["no prefetch (m1_r4_t256)"] - 1
        lines.append(f"| {shape} | " + " | ".join(f"{v:.2f}" for v in rows.values()) + f" | {change:+.1%} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    args = parse_bench_args(parser)
    report = {
        "commit": git_commit(), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
        "results": run(args.shapes, args.replays),
    }
    save_report(args.out, "chain", report, markdown(report))


if __name__ == "__main__":
    main()
