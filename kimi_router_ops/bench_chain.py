"""python -m kimi_router_ops.bench_chain: producer -> router latency, the case PDL is for.

The producer is the library's own `rms_norm` (PDL-launched: it lets its dependents launch at
entry and waits before reading x). The router follows it on the same stream, so a PDL
router launches while the norm runs and a prefetching one is already loading its weights.
One CUDA graph holds one (norm, router) pair per distinct weight copy (cold L2); each
result is the median time per pair. For each router kernel this reports the router alone,
the pair, and the overlap (norm alone + router alone - pair). Routers: the automatic choice
(prefetch), the M = 1 prefetch windows of 1, 2, 4 and 8 of its 16 loads per thread, no
prefetch, PDL off, and cuBLAS; the baseline is what a user has today: F.rms_norm, then
torch.mm with fp32 output. Last, the producer alone against F.rms_norm for M = 1..16.
"""

import argparse
import datetime

import torch
import torch.nn.functional as F

import kimi_router_ops
from kimi_router_ops.bench import SHAPES, git_commit, parse_bench_args, save_report
from kimi_router_ops.timing import graph_time_us, l2_bytes, weight_copies

EPS = 1e-6
NO_PREFETCH = {1: "m1_r4_t256", 2: "mma8_t2c4w8u7_noprefetch", 4: "mma8_t2c4w8u7_noprefetch"}


def routers(m):
    """name -> router(hidden, w) for M = m."""
    named = lambda v: lambda h, w: kimi_router_ops.ll_bf16_gemm_with_variant(h, w, v)  # noqa: E731
    out = {"prefetch (auto)": lambda h, w: kimi_router_ops.ll_bf16_gemm(h, w)}
    if m == 1:
        out.update({f"window {n}": named(f"m1_prefetch_r4_t256_w{n}") for n in (1, 2, 4, 8)})
    out["no prefetch"] = named(NO_PREFETCH[m])
    if m == 1:
        out["PDL off"] = named("m1_r4_t256_nopdl")
    out["cuBLAS"] = lambda h, w: torch.mm(h, w.t(), out_dtype=torch.float32)
    return out


def run(shapes, m_list, replays):
    results = []
    for shape in shapes:
        n, k = SHAPES[shape]
        weights = weight_copies(n, k, 3 * l2_bytes())
        for m in m_list:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            gamma = torch.rand(k, device="cuda").to(torch.bfloat16)
            hidden = kimi_router_ops.rms_norm(x, gamma, EPS)
            ref = hidden.double() @ weights[0].double().t()
            row = {"shape": shape, "M": m}

            def timed(calls):
                return round(graph_time_us(calls, replays=replays), 3)

            row["norm alone"] = timed([lambda: kimi_router_ops.rms_norm(x, gamma, EPS)] * len(weights))
            row["F.rms_norm alone"] = timed([lambda: F.rms_norm(x, (k,), gamma, EPS)] * len(weights))
            row["baseline pair"] = timed(
                [lambda w=w: torch.mm(F.rms_norm(x, (k,), gamma, EPS), w.t(), out_dtype=torch.float32) for w in weights]
            )
            for name, router in routers(m).items():
                err = ((router(hidden, weights[0]).double() - ref).norm() / ref.norm()).item()
                assert err < 1e-5, (name, err)
                alone = timed([lambda w=w, r=router: r(hidden, w) for w in weights])
                pair = timed([lambda w=w, r=router: r(kimi_router_ops.rms_norm(x, gamma, EPS), w) for w in weights])
                row[name] = {"alone": alone, "pair": pair,
                             "overlap": round(row["norm alone"] + alone - pair, 3)}
            results.append(row)
        del weights
    return results


def run_norms(k, m_list, replays):
    """The producer alone against F.rms_norm (what a model runs without the library)."""
    rows = []
    for m in m_list:
        x, residual = (torch.randn(m, k, device="cuda").to(torch.bfloat16) for _ in range(2))
        gamma = torch.rand(k, device="cuda").to(torch.bfloat16)
        rows.append({"M": m, **{
            name: round(graph_time_us([fn] * 8, replays=replays), 3) for name, fn in {
                "rms_norm": lambda: kimi_router_ops.rms_norm(x, gamma, EPS),
                "fused_add_rms_norm": lambda: kimi_router_ops.fused_add_rms_norm(x, residual, gamma, EPS),
                "F.rms_norm": lambda: F.rms_norm(x, (k,), gamma, EPS),
                "add + F.rms_norm": lambda: F.rms_norm(x + residual, (k,), gamma, EPS),
            }.items()
        }})
    return rows


def norm_markdown(rows, k):
    names = [n for n in rows[0] if n != "M"]
    lines = [f"The producer alone, [M, {k}], us:", "", "| M | " + " | ".join(names) + " | F.rms_norm / rms_norm |",
             "|---" * (len(names) + 2) + "|"]
    for r in rows:
        lines.append(f"| {r['M']} | " + " | ".join(f"{r[n]:.2f}" for n in names) + f" | {r['F.rms_norm'] / r['rms_norm']:.2f}x |")
    return "\n".join(lines) + "\n"


def markdown(report):
    lines = [
        f"{report['gpu']}, torch {report['torch']}, commit {report['commit']}, {report['date']}: "
        "kimi rms_norm -> router, us (median of graph replays, cold L2); each router cell is "
        "pair (router alone, overlap)",
        "",
    ]
    for m in dict.fromkeys(r["M"] for r in report["results"]):
        rows = [r for r in report["results"] if r["M"] == m]
        names = [k for k in rows[0] if isinstance(rows[0][k], dict)]
        lines += [
            f"M = {m}:",
            "",
            "| shape | norm alone | F.rms_norm alone | " + " | ".join(names)
            + " | F.rms_norm -> torch.mm | prefetch vs no prefetch | pair - router alone | baseline / pair |",
            "|---" * (len(names) + 7) + "|",
        ]
        for r in rows:
            auto, plain = r["prefetch (auto)"], r["no prefetch"]
            cells = [f"{r[n]['pair']:.2f} ({r[n]['alone']:.2f}, {r[n]['overlap']:+.2f})" for n in names]
            lines.append(
                f"| {r['shape']} | {r['norm alone']:.2f} | {r['F.rms_norm alone']:.2f} | " + " | ".join(cells)
                + f" | {r['baseline pair']:.2f} | {auto['pair'] / plain['pair'] - 1:+.1%}"
                + f" | {auto['pair'] - auto['alone']:+.2f} | {r['baseline pair'] / auto['pair']:.2f}x |"
            )
        lines.append("")
    if report.get("norms"):
        lines.append(norm_markdown(report["norms"], SHAPES["kimi-k3"][1]))
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--m", nargs="+", type=int, default=[1, 2, 4], choices=sorted(NO_PREFETCH))
    args = parse_bench_args(parser)
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
        "results": run(args.shapes, args.m, args.replays),
        "norms": run_norms(SHAPES["kimi-k3"][1], range(1, 17), args.replays),
    }
    save_report(args.out, "chain", report, markdown(report))


if __name__ == "__main__":
    main()
