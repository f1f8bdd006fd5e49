"""python -m kimi_router_ops.bench.router: the whole router (GEMM + routing) at decode.

For the real router configurations and M = 1..256 this times, the same way as the GEMM
benchmark (one CUDA graph of one call per weight copy, cold L2, median per call; back to
back and serialized; one bias per weight copy, so the bias is cold too): `ll_bf16_router`;
`ll_bf16_gemm` alone; `ll_bf16_gemm` then `moe_routing` (two launches); `moe_routing`
alone (on warm logits); `ll_bf16_gemm` followed by the routing as torch ops (the transformers
formula), eagerly and under `torch.compile`; and with --gemm-variants, those GEMM rows
alone. Each cell is the
median of --rounds rounds, taken in turn, each on weights and biases of its own (a
placement in memory of its own) with fresh captures. Writes <out>/router.json and
<out>/router.md.
"""

import argparse
import datetime
import statistics

import torch

import kimi_router_ops
from kimi_router_ops import tables
from .report import git_commit, parse_bench_args, save_report
from .timing import empty_node_us
from .timing import graph_time_us, l2_bytes, weight_copies

# name: (K hidden, N experts, top_k, n_group, topk_group, routed_scaling_factor, scoring)
CONFIGS = {
    "deepseek-v3": (7168, 256, 8, 8, 4, 2.5, "sigmoid"),
    "kimi-k2": (7168, 384, 8, 1, 1, 2.827, "sigmoid"),
    "kimi-k3": (7168, 896, 16, 1, 1, 1.0, "sigmoid"),
    "glm-4.5-air": (4096, 128, 8, 1, 1, 1.0, "sigmoid"),
    "qwen3-235b": (4096, 128, 8, 1, 1, 1.0, "softmax"),
    "qwen3-30b": (2048, 128, 8, 1, 1, 1.0, "softmax"),
    "deepseek-v4-pro": (7168, 384, 6, 1, 1, 2.5, "sqrtsoftplus"),
    "deepseek-v4-flash": (4096, 256, 6, 1, 1, 1.5, "sqrtsoftplus"),
}


def torch_routing(logits, bias, top_k, n_group, topk_group, scale, scoring="sigmoid"):
    """The routing after the logits as torch ops (fp32): DeepseekV3TopkRouter's (with
    sqrtsoftplus DeepSeek-V4's scores), or with softmax Qwen3MoeTopKRouter's (softmax, top-k,
    renormalized; no bias, no groups)."""
    if scoring == "softmax":
        weights, ids = logits.softmax(-1).topk(top_k, dim=-1)
        return weights / weights.sum(-1, keepdim=True) * scale, ids
    m, n = logits.shape
    scores = logits.sigmoid() if scoring == "sigmoid" else torch.nn.functional.softplus(logits).sqrt()
    choice = scores + bias if bias is not None else scores
    group_scores = choice.view(m, n_group, n // n_group).topk(min(2, n // n_group), dim=-1)[0].sum(-1)
    group_idx = group_scores.topk(topk_group, dim=-1)[1]
    kept = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, group_idx, True)
    choice = choice.view(m, n_group, -1).masked_fill(~kept.unsqueeze(-1), float("-inf")).view(m, n)
    ids = choice.topk(top_k, dim=-1)[1]
    weights = scores.gather(1, ids)
    return weights / (weights.sum(-1, keepdim=True) + 1e-20) * scale, ids


_COMPILED = {}


def compiled_gemm_then_torch(config):
    """The GEMM op then the torch routing under torch.compile, one graph per config with a
    dynamic M (compiled once, as a model would be)."""
    if config not in _COMPILED:
        _, n, top_k, n_group, topk_group, scale, scoring = CONFIGS[config]

        def gemm_then_torch(x, w, bias):
            return torch_routing(kimi_router_ops.ll_bf16_gemm(x, w), bias, top_k, n_group, topk_group, scale,
                                 scoring)

        _COMPILED[config] = torch.compile(gemm_then_torch, fullgraph=True, dynamic=True)
    return _COMPILED[config]


def implementations(config, m, gemm_variants=()):
    _, n, top_k, n_group, topk_group, scale, scoring = CONFIGS[config]
    route = (top_k, n_group, topk_group, True, scale)

    def gemm_then_torch(x, w, bias):
        return torch_routing(kimi_router_ops.ll_bf16_gemm(x, w), bias, top_k, n_group, topk_group, scale,
                             scoring)

    compiled = compiled_gemm_then_torch(config)
    # The routing alone on logits that stay warm in L2 (one tensor for every call).
    logits = torch.randn(m, n, device="cuda")
    impls = {
        "ll_bf16_router": lambda x, w, b: kimi_router_ops.ll_bf16_router(x, w, b, *route, scoring),
        "ll_bf16_gemm alone": lambda x, w, b: kimi_router_ops.ll_bf16_gemm(x, w),
        "gemm + moe_routing": lambda x, w, b: kimi_router_ops.moe_routing(
            kimi_router_ops.ll_bf16_gemm(x, w), b, *route, scoring),
        "moe_routing alone": lambda x, w, b: kimi_router_ops.moe_routing(logits, b, *route, scoring),
        "gemm + torch routing, eager": gemm_then_torch,
        "gemm + torch routing, compiled": compiled,
    }
    # GEMM rows named on the command line, alone: what the fused rows' GEMM kernels cost.
    for name in gemm_variants:
        v = tables.gemm.variant(name)
        if m <= v.max_m:
            impls[f"gemm {name}"] = lambda x, w, b, name=name: kimi_router_ops.router_gemm_with_variant(x, w, name)
    return impls


def run(configs, m_list, replays, rounds, gemm_variants=()):
    from tqdm import tqdm

    node_us = empty_node_us()
    tiny = torch.zeros(1, device="cuda")  # a plain kernel before each call: no overlap
    results = []
    for config, m in tqdm([(c, m) for c in configs for m in m_list], desc="router", unit="case"):
        k, n, *_, scoring = CONFIGS[config]
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        impls = implementations(config, m, gemm_variants)
        samples = {impl: ([], []) for impl in impls}
        placements = []  # kept to the end of the case, so no round reuses another's memory
        # Each round allocates its own weights and biases and captures every
        # implementation's graphs afresh (new outputs and handoff buffers), in turn: where
        # the buffers land in memory sets which of two speed levels a kernel runs at
        # (docs/kernel-notes.md), so a cell is the median over placements, and a drift
        # in the GPU's state during the case reaches every implementation alike.
        for _ in range(rounds):
            weights = weight_copies(n, k, 3 * l2_bytes())
            # One bias per weight copy, as a model has one per layer: cold in L2 like the
            # weights. (Softmax routers have none.)
            biases = [(torch.randn(n, device="cuda") * 0.05).float() if scoring != "softmax" else None
                      for _ in weights]
            calls = list(zip(weights, biases))
            placements.append(calls)
            for impl, fn in impls.items():
                back_to_back, serialized = samples[impl]
                back_to_back.append(graph_time_us([lambda w=w, b=b: fn(x, w, b) for w, b in calls],
                                                  replays=replays))
                serialized.append(graph_time_us([lambda w=w, b=b: (tiny.add_(1), fn(x, w, b)) for w, b in calls],
                                                replays=replays) - node_us)
        for impl, (back_to_back, serialized) in samples.items():
            results.append({"config": config, "M": m, "impl": impl,
                            "us": round(statistics.median(back_to_back), 3),
                            "serial_us": round(statistics.median(serialized), 3),
                            "rounds_us": [round(us, 3) for us in back_to_back]})
        del placements
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(), "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
        "replays": replays, "rounds": rounds, "results": results,
    }


def markdown(report) -> str:
    impls = list(dict.fromkeys(r["impl"] for r in report["results"]))
    lines = [
        f"{report['gpu']}, torch {report['torch']}, commit {report['commit']}, {report['date']}: "
        f"us per call, cold L2, median of {report.get('rounds', 1)} rounds; back to back "
        "(serialized in brackets)",
        "",
        "| config | M | " + " | ".join(impls) + " | router − GEMM | compiled ÷ router |",
        "|---" * (len(impls) + 4) + "|",
    ]
    for config, m in dict.fromkeys((r["config"], r["M"]) for r in report["results"]):
        rows = {r["impl"]: r for r in report["results"] if r["config"] == config and r["M"] == m}
        cells = [f"{rows[i]['us']:.2f} ({rows[i]['serial_us']:.2f})" if i in rows else "" for i in impls]
        router = rows["ll_bf16_router"]["us"]
        extra = router - rows["ll_bf16_gemm alone"]["us"]
        speedup = rows["gemm + torch routing, compiled"]["us"] / router
        lines.append(f"| {config} | {m} | " + " | ".join(cells) + f" | {extra:+.2f} | {speedup:.2f}x |")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--m", nargs="+", type=int, default=[1, 2, 4, 8, 16, 24, 32, 64, 128, 256])
    parser.add_argument("--rounds", type=int, default=3,
                        help="fresh graphs per cell, taken in turn; the cell is their median")
    parser.add_argument("--gemm-variants", nargs="*", default=[], choices=[v.name for v in tables.gemm.ALL_VARIANTS],
                        help="GEMM rows to time alone as well, where they serve the case")
    args = parse_bench_args(parser)
    report = run(args.configs, args.m, args.replays, max(1, args.rounds), args.gemm_variants)
    save_report(args.out, "router", report, markdown(report))


if __name__ == "__main__":
    main()
