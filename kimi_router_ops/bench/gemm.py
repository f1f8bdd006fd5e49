"""python -m kimi_router_ops.bench (or .bench.gemm): router GEMM latency at decode on this GPU.

Every implementation runs in the same process, timed the same way: a CUDA graph of one call
per distinct weight copy (together over 3x the L2 size, so each call reads its weights from
HBM), replayed >= 30 times after warm-up, median per call. The HBM read bandwidth and the
cost of an empty graph node are measured in the same run; each result is also given as a
ratio to the floor (weight bytes / bandwidth).

Writes <out>/bench.json, <out>/bench.md and <out>/bench.png.
"""

import argparse
import subprocess

import torch
import torch.nn.functional as F

import kimi_router_ops
from kimi_router_ops import tables
from .report import parse_bench_args, report_header, save_report
from .timing import empty_node_us, graph_time_us, hbm_read_bandwidth, l2_bytes, weight_copies

SHAPES = {"kimi-k3": (896, 7168), "kimi-k2": (384, 7168), "deepseek-v3": (256, 7168)}
M_LIST = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


def implementations(m, sweep=False):
    """name -> fn(x, w) for problem size m: the op, cuBLAS, and every bf16 kernel of the
    dispatch that computes m in one token tile (with `sweep`, above 16 tokens: the
    tensor-core kernels of 16 tokens a CTA or more)."""
    impls = {
        "ll_bf16_gemm (auto)": lambda x, w: kimi_router_ops.ll_bf16_gemm(x, w),
        "F.linear (bf16 out)": lambda x, w: F.linear(x, w),
        "torch.mm (fp32 out)": lambda x, w: torch.mm(x, w.t(), out_dtype=torch.float32),
    }
    for v in tables.gemm.VARIANTS:
        if v.kernel.weight_dtype != "bfloat16":
            continue  # bench.precisions times the fp32-weight kernels
        if m <= 16 or not sweep:
            chosen = m <= v.tokens
        else:
            chosen = isinstance(v.kernel, tables.gemm.Mma) and v.tokens >= 16
        if chosen:
            impls[f"forced {v.name}"] = (
                lambda x, w, name=v.name: kimi_router_ops.router_gemm_with_variant(x, w, name)
            )
    return impls


def host_overhead_us(fn, calls: int = 100, repeats: int = 20) -> float:
    """CPU time per eager call (Python -> op -> launch), no synchronization: the best of
    `repeats` bursts of `calls` calls, few enough that the launch queue never fills."""
    import time

    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    torch.cuda.synchronize()
    return best * 1e6


def host_overheads():
    n, k = SHAPES["kimi-k3"]
    x = torch.randn(1, k, device="cuda").to(torch.bfloat16)
    w = torch.randn(n, k, device="cuda").to(torch.bfloat16)
    op = torch.ops.kimi.ll_bf16_gemm.default
    return {
        "torch.ops.kimi.ll_bf16_gemm": round(host_overhead_us(lambda: op(x, w, torch.float32)), 2),
        "kimi_router_ops.ll_bf16_gemm": round(host_overhead_us(lambda: kimi_router_ops.ll_bf16_gemm(x, w)), 2),
        "F.linear": round(host_overhead_us(lambda: F.linear(x, w)), 2),
        "torch.mm fp32 out": round(host_overhead_us(lambda: torch.mm(x, w.t(), out_dtype=torch.float32)), 2),
    }


def run(shapes, m_list, replays, sweep=False):
    from tqdm import tqdm

    bandwidth = hbm_read_bandwidth()
    node_us = empty_node_us()
    tiny = torch.zeros(1, device="cuda")
    major, minor = torch.cuda.get_device_capability()
    results = []
    jobs = [(s, m) for s in shapes for m in m_list]
    for shape, m in tqdm(jobs, desc="bench", unit="case"):
        n, k = SHAPES[shape]
        weights = weight_copies(n, k, 3 * l2_bytes())
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        floor_us = n * k * 2 / bandwidth * 1e6
        for impl, fn in implementations(m, sweep).items():
            try:
                us = graph_time_us([lambda w=w: fn(x, w) for w in weights], replays=replays)
                # Serialized: a plain (non-PDL) kernel before every call, so no call overlaps
                # its neighbours; its own cost (one empty node) is subtracted.
                serial_us = graph_time_us(
                    [lambda w=w: (tiny.add_(1), fn(x, w)) for w in weights], replays=replays
                ) - node_us
            except RuntimeError as error:  # a variant that cannot launch here (resources)
                print(f"{shape} M={m} {impl}: {error}".splitlines()[0])
                continue
            results.append({
                "shape": shape, "N": n, "K": k, "M": m, "impl": impl, "us": round(us, 3),
                "serial_us": round(serial_us, 3),
                "floor_us": round(floor_us, 3), "x_floor": round(us / floor_us, 3),
                "kernel": kimi_router_ops.chosen_variant(m, n, k, sm=major * 10 + minor)
                if impl.startswith("ll_bf16_gemm") else impl,
            })
        del weights
    return report_header(
        cuda=torch.version.cuda, driver=_driver_version(), hbm_read_TBps=round(bandwidth / 1e12, 3),
        empty_node_us=round(node_us, 3), host_overhead_us=host_overheads(), replays=replays, results=results)


def _driver_version() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def markdown(report) -> str:
    lines = [
        f"{report['gpu']}, driver {report['driver']}, torch {report['torch']} (CUDA {report['cuda']}), "
        f"commit {report['commit']}, {report['date']}",
        f"HBM read {report['hbm_read_TBps']} TB/s, empty graph node {report['empty_node_us']} us; "
        f"median of {report['replays']} graph replays, cold L2. Cells: us per call (x floor), calls "
        "back to back; 'serialized': a plain kernel before each call, so calls never overlap.",
        f"Eager host overhead per call (Kimi-K3, M=1, no sync): {report['host_overhead_us']} us.",
        "",
    ]
    for shape in dict.fromkeys(r["shape"] for r in report["results"]):
        rows = [r for r in report["results"] if r["shape"] == shape]
        impls = list(dict.fromkeys(r["impl"] for r in rows))
        ms = sorted({r["M"] for r in rows})
        floor = rows[0]["floor_us"]
        lines += [f"### {shape} (N={rows[0]['N']}, K={rows[0]['K']}, floor {floor} us)", ""]
        lines.append("| M | " + " | ".join(impls) + " | auto, serialized | kernel |")
        lines.append("|---" * (len(impls) + 3) + "|")
        for m in ms:
            cells = []
            for impl in impls:
                r = next((r for r in rows if r["M"] == m and r["impl"] == impl), None)
                cells.append(f"{r['us']:.2f} ({r['x_floor']:.2f}x)" if r else "")
            kernel = next(r["kernel"] for r in rows if r["M"] == m and r["impl"].startswith("ll_bf16_gemm"))
            auto = next(r for r in rows if r["M"] == m and r["impl"].startswith("ll_bf16_gemm"))
            lines.append(f"| {m} | " + " | ".join(cells) + f" | {auto['serial_us']:.2f} | {kernel} |")
        lines.append("")
    return "\n".join(lines)


def plot(report, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(dict.fromkeys(r["shape"] for r in report["results"]))
    fig, axes = plt.subplots(1, len(shapes), figsize=(6 * len(shapes), 4.5), squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        rows = [r for r in report["results"] if r["shape"] == shape]
        for impl in dict.fromkeys(r["impl"] for r in rows):
            pts = sorted((r["M"], r["us"]) for r in rows if r["impl"] == impl)
            ax.plot(*zip(*pts), marker="o", label=impl)
        ax.axhline(rows[0]["floor_us"], color="k", linestyle="--", label="HBM floor")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M (tokens)")
        ax.set_ylabel("us per call")
        ax.set_title(f"{shape} N={rows[0]['N']} K={rows[0]['K']}")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"router GEMM, {report['gpu']}, cold L2")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def sweep_markdown(report, top: int = 3) -> str:
    """Per (shape, M): the automatic choice, cuBLAS, and the fastest forced variants."""
    lines = [
        f"{report['gpu']}, torch {report['torch']}, commit {report['commit']}, {report['date']}; "
        f"HBM read {report['hbm_read_TBps']} TB/s; us per call, cold L2.",
    ]
    header = "| shape | M | auto (kernel) | cuBLAS fp32 | " + " | ".join(f"#{i + 1}" for i in range(top)) + " |"
    cases = dict.fromkeys((r["shape"], r["M"]) for r in report["results"])
    for key, title in (("us", "back-to-back calls"), ("serial_us", "serialized calls")):
        lines += ["", f"Ranked by {title} ({key}):", "", header, "|---" * (4 + top) + "|"]
        for shape, m in cases:
            rows = [r for r in report["results"] if r["shape"] == shape and r["M"] == m]
            by_impl = {r["impl"]: r for r in rows}
            auto = by_impl["ll_bf16_gemm (auto)"]
            forced = sorted((r for r in rows if r["impl"].startswith("forced ")), key=lambda r: r[key])
            best = [f"{r[key]:.2f} {r['impl'].removeprefix('forced ')}" for r in forced[:top]]
            best += [""] * (top - len(best))
            lines.append(
                f"| {shape} | {m} | {auto[key]:.2f} ({auto['kernel']}) | "
                f"{by_impl['torch.mm (fp32 out)'][key]:.2f} | " + " | ".join(best) + " |"
            )
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--nk", nargs="+", default=[], metavar="N,K",
                        help="other router shapes to time as well (the hidden-size sweep)")
    parser.add_argument("--m", nargs="+", type=int, help=f"token counts (default {M_LIST}; "
                        f"with --sweep 1..{tables.gemm.MAX_M})")
    parser.add_argument("--sweep", action="store_true",
                        help="retuning: every compiled variant at the decode M, ranked per (shape, M)")
    args = parse_bench_args(parser)
    for nk in args.nk:
        n, k = (int(v) for v in nk.split(","))
        SHAPES[f"n{n}_k{k}"] = (n, k)
        args.shapes.append(f"n{n}_k{k}")
    m_list = args.m or (list(range(1, tables.gemm.MAX_M + 1)) if args.sweep else list(M_LIST))
    report = run(args.shapes, m_list, args.replays, args.sweep)
    if args.sweep:
        save_report(args.out, "sweep", report, sweep_markdown(report))
    else:
        plot(report, args.out / "bench.png")
        save_report(args.out, "bench", report, markdown(report))


if __name__ == "__main__":
    main()
