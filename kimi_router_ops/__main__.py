"""python -m kimi_router_ops: the router GEMM on Kimi-K3's shape, checked and timed.

Runs on the best device present (the CPU without a GPU), checks every M against a float64
reference and prints: device, the kernel the dispatch chose, microseconds per call and the
relative error; on a GPU, cuBLAS (torch.mm with fp32 output) beside it.
"""

BENCHES = """the benchmarks (a GPU; docs/benchmarks.md):
  python -m kimi_router_ops.bench             the router GEMM, M = 1..256
  python -m kimi_router_ops.bench.router      the whole router and the routing op
  python -m kimi_router_ops.bench.chain       producer -> router pairs, after the layer
  python -m kimi_router_ops.bench.front       Kimi-K3's MoE front: AttnRes, gate, down-projection
  python -m kimi_router_ops.bench.precisions  fp32 gates and the gate bias"""

import argparse
import time

import torch

import kimi_router_ops

N, K = 896, 7168  # Kimi-K3 router: 896 experts, hidden size 7168
M_LIST = (1, 2, 4, 8, 16, 64)


def relative_error(out, x, w):
    ref = x.double() @ w.double().t()
    return ((out.double() - ref).norm() / ref.norm()).item()


def cpu_time_us(fn, repeats=20):
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e6


def main():
    parser = argparse.ArgumentParser(prog="python -m kimi_router_ops", description=__doc__.strip(),
                                     epilog=BENCHES, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where to run (default: cuda if a GPU is visible, else cpu)")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA GPU is visible to torch; run with --device cpu")
    device = torch.device(args.device)
    torch.manual_seed(0)

    if device.type == "cuda":
        from kimi_router_ops.bench.timing import graph_time_us, l2_bytes, weight_copies

        major, minor = torch.cuda.get_device_capability(device)
        sm = major * 10 + minor
        name = f"{torch.cuda.get_device_name(device)} (sm_{sm})"
        weights = weight_copies(N, K, 3 * l2_bytes(device), device)  # cold L2 per call
    else:
        sm, name, weights = 0, "cpu", [torch.randn(N, K).to(torch.bfloat16)]
        built = len(kimi_router_ops.compiled_kernels())
        print("On the CPU: this checks the CPU reference. Its times are CPU times, not results;"
              + (f" the {built} CUDA kernels built into _C run only on an sm_90 or sm_100 GPU."
                 if built else " this _C was built without CUDA kernels.")
              + " On such a GPU, run this again, or `python -m kimi_router_ops.bench`.")
    print(f"kimi_router_ops on {name}: logits[M, {N}] = x[M, {K}] @ W[{N}, {K}]^T, fp32 out")
    header = f"{'M':>4}  {'kernel':<18} {'us/call' if device.type == 'cuda' else 'CPU us':>9} {'rel.err':>9}"
    if device.type == "cuda":
        header += f"  {'cuBLAS us':>9} {'speedup':>7}"
    print(header)
    worst = 0.0
    for m in M_LIST:
        x = torch.randn(m, K, device=device).to(torch.bfloat16)
        w = weights[0]
        err = relative_error(kimi_router_ops.ll_bf16_gemm(x, w), x, w)
        worst = max(worst, err)
        line = ""
        if device.type == "cuda":
            kernel = kimi_router_ops.chosen_variant(m, N, K, sm=sm)
            ours = graph_time_us([lambda w=w: kimi_router_ops.ll_bf16_gemm(x, w) for w in weights])
            cublas = graph_time_us([lambda w=w: torch.mm(x, w.t(), out_dtype=torch.float32) for w in weights])
            line = f"  {cublas:9.2f} {cublas / ours:6.2f}x"
        else:
            kernel = "cpu reference"
            ours = cpu_time_us(lambda: kimi_router_ops.ll_bf16_gemm(x, w))
        print(f"{m:>4}  {kernel:<18} {ours:9.2f} {err:9.2e}" + line)
    status = "ok" if worst <= 1e-5 else "FAILED"
    print(f"max relative error {worst:.2e} (limit 1e-5): {status}")
    if status != "ok":
        raise SystemExit(1)


if __name__ == "__main__":
    main()
