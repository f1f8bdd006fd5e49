"""python -m kimi_router_ops.bench.chain: the router behind its producer, as a model runs it.

In a decode step the router follows a producer (an RMSNorm, or Kimi-K3's AttnRes) through
PDL, and the producer follows the rest of the layer, whose last kernel does not release it
early. So each (producer, consumer) pair is timed two ways, in CUDA graphs of one pair per
weight copy (cold weights and biases):
- after the layer: a non-PDL kernel (an elementwise op over 48 MiB, about 25 us, which also
  evicts L2) before each pair; the pair's time is the graph's minus that of the layer
  kernels alone;
- back to back: pair after pair, each launch overlapping the one before it.
Producers: none (the consumer alone), `rms_norm`, `fused_add_rms_norm`, `attn_res` with 2 and
8 blocks (3 and 9 sources, a delta, the output norm: Kimi-K3's pre-MoE call). Consumers:
`ll_bf16_gemm`, the same without the weight prefetch (where a named kernel exists), cuBLAS
above M = 16, GEMM kernels named with --gemms, fused router rows named with --routers, vLLM 0.33's `ll_bf16` where its peer is built (as shipped, and
at M = 1 its default kernel without the prefetch),
`ll_bf16_router`, `ll_bf16_gemm` then `moe_routing`, the producer and router in one op
(`rms_norm_router`, `fused_add_rms_norm_router`, `attn_res_router`: "producer + router in one
op"), `router_out` into an engine's buffers
(int64 ids, expert counts) and `router` in batch-invariant mode; for DeepSeek-V4's shapes also the
router without a bias, the router of a hash-routed layer (ids from a token table) and vLLM
0.33's pipeline where its peers are built (kimi_router_ops/bench/peers.py): its gate GEMM
(`ll_bf16` where it has the shape, else cuBLAS with fp32 out, as its GateLinear falls back)
then its Triton `dsv4_topk`. Writes <out>/chain.json, chain.md.
"""

import argparse

import torch

import kimi_router_ops
from kimi_router_ops import tables
from kimi_router_ops.testing import gemm_row_linked
from .report import parse_bench_args, report_header, save_report, two_way_markdown
from .peers import vllm_dsv4_topk, vllm_gate, vllm_serves
from .router import CONFIGS
from .timing import AFTER_LAYER_CALLS, after_layer_timer, graph_time_us, l2_bytes, weight_copies

EPS = 1e-6
SHAPES = ("kimi-k3", "kimi-k2", "deepseek-v3", "deepseek-v4-pro", "deepseek-v4-flash")
DEFAULT_SHAPES = SHAPES[:3]
VOCAB = 129280  # DeepSeek-V4's
M_LIST = (1, 2, 4, 8, 16)
# The same GEMM without its weight loads before the PDL wait (kimi_router_ops/tables/gemm.py).
NO_PREFETCH = {1: "m1_r4_t256", 2: "mma8_t2c4w8u7_noprefetch", 4: "mma8_t2c4w8u7_noprefetch",
               8: "mma8_t2c4w8u7_noprefetch"}


def _producer_inputs(m, k):
    """The producers' inputs [m, k]: x, residual, the norm weight, and AttnRes's prefix, delta,
    blocks and query weight for 2 and 8 blocks."""
    bf = lambda *s: torch.randn(*s, device="cuda").to(torch.bfloat16)  # noqa: E731
    gamma = (torch.rand(k, device="cuda") + 0.5).to(torch.bfloat16)
    # prefix grows by delta at every call (a random walk: finite for far more replays than run).
    attn_res = {nb: (bf(m, k), bf(m, k) * 1e-3, bf(m, nb, k), bf(k) * 0.05) for nb in (2, 8)}
    return bf(m, k), bf(m, k), gamma, attn_res


def producers(m, k):
    """name -> thunk returning the hidden states [m, k] (None: the consumer alone, on a
    fixed input)."""
    x, residual, gamma, attn_res = _producer_inputs(m, k)
    out = {
        "none": None,
        "rms_norm": lambda: kimi_router_ops.rms_norm(x, gamma, EPS),
        "fused_add_rms_norm": lambda: kimi_router_ops.fused_add_rms_norm(x, residual, gamma, EPS)[0],
    }
    for nb, (prefix, delta, blocks, qk) in attn_res.items():
        out[f"attn_res nb={nb}"] = (
            lambda prefix=prefix, delta=delta, blocks=blocks, qk=qk, nb=nb:
            kimi_router_ops.attn_res(prefix, delta, blocks, gamma, qk, gamma, nb, -1, EPS, EPS)
        )
    return out


def fused_fronts(m, config):
    """producer name -> fn(weight, bias): the producer and the router in one op
    (rms_norm_router, fused_add_rms_norm_router, attn_res_router), on inputs of the producer's
    shape."""
    k, _, top_k, n_group, topk_group, scale, scoring = config
    routing = dict(top_k=top_k, n_group=n_group, topk_group=topk_group, routed_scaling_factor=scale,
                   scoring=scoring)
    x, residual, gamma, attn_res = _producer_inputs(m, k)
    out = {
        "rms_norm": lambda w, b: kimi_router_ops.rms_norm_router(x, gamma, EPS, w, b, **routing),
        "fused_add_rms_norm": lambda w, b: kimi_router_ops.fused_add_rms_norm_router(x, residual, gamma, EPS, w, b,
                                                                                     **routing),
    }
    for nb, (prefix, delta, blocks, qk) in attn_res.items():
        out[f"attn_res nb={nb}"] = (
            lambda w, b, prefix=prefix, delta=delta, blocks=blocks, qk=qk, nb=nb: kimi_router_ops.attn_res_router(
                prefix, delta, blocks, gamma, qk, gamma, nb, -1, EPS, EPS, w, b, **routing))
    return out


def cublas(hidden, weight):
    """fp32 logits from cuBLAS, as vLLM's GateLinear computes them where no kernel of its own serves."""
    return torch.mm(hidden, weight.t(), out_dtype=torch.float32)


def consumers(m, config, peers, gemms=(), routers=()):
    """name -> fn(hidden, weight, bias) for the router configuration; `peers` holds vLLM's
    gate GEMM and DeepSeek-V4 routing (None where not built)."""
    _, _, top_k, n_group, topk_group, scale, scoring = config
    routing = dict(top_k=top_k, n_group=n_group, topk_group=topk_group, routed_scaling_factor=scale,
                   scoring=scoring)
    k, n = config[:2]
    out = {"ll_bf16_gemm": lambda h, w, b: kimi_router_ops.ll_bf16_gemm(h, w)}
    if m in NO_PREFETCH and gemm_row_linked(NO_PREFETCH[m]):  # a lab row: KIMI_ROUTER_OPS_LAB=1 builds it
        out["gemm, no prefetch"] = lambda h, w, b: kimi_router_ops.router_gemm_with_variant(h, w, NO_PREFETCH[m])
    for name in gemms:  # named kernels (lab rows), where one CTA computes M tokens
        if m <= tables.gemm.variant(name).max_m:
            out[f"forced {name}"] = lambda h, w, b, name=name: kimi_router_ops.router_gemm_with_variant(h, w, name)
    if m > 16:  # where the GEMM table's tensor-core rows stand against cuBLAS
        out["cuBLAS (torch.mm, fp32 out)"] = lambda h, w, b: cublas(h, w)
    if peers["gate"] is not None and vllm_serves(m, n, k):
        out["vLLM ll_bf16"] = lambda h, w, b: peers["gate"](h, w)
        if m == 1:  # its default kernel, without the weight prefetch
            out["vLLM ll_bf16, no prefetch"] = lambda h, w, b: torch.ops.vllm_ll.gemm(h, w, 0)
    out["ll_bf16_router"] = lambda h, w, b: kimi_router_ops.ll_bf16_router(h, w, b, **routing)
    for row in routers:  # named fused router rows, where they serve M, N and K
        row = next(r for r in tables.router.ROUTER_VARIANTS if r.name == row)
        if row.m_lo <= m <= row.m_hi and row.n_min <= n <= row.n_max and row.k_only in (0, k):
            out[f"forced {row.name}"] = lambda h, w, b, name=row.name: kimi_router_ops.router_with_variant(
                h, w, b, top_k, n_group, topk_group, True, scale, name, scoring)
    out["gemm + moe_routing"] = lambda h, w, b: kimi_router_ops.moe_routing(
        kimi_router_ops.ll_bf16_gemm(h, w), b, **routing)
    # An engine's call: its own buffers (int64 ids), the expert counts of its dispatch.
    buffers = dict(topk_weights=torch.empty(m, top_k, device="cuda"),
                   topk_ids=torch.empty(m, top_k, dtype=torch.int64, device="cuda"),
                   logits=torch.empty(m, n, device="cuda"), expert_counts=torch.zeros(n, dtype=torch.int32, device="cuda"))
    out["router_out, int64 ids + counts"] = lambda h, w, b: kimi_router_ops.router_out(h, w, b, **routing, **buffers)
    out["router, batch-invariant"] = lambda h, w, b: batch_invariant(kimi_router_ops.router, h, w, b, **routing)
    if scoring == "sqrtsoftplus":  # DeepSeek-V4: its plain layers without a bias, its hash layers
        table = torch.rand(VOCAB, n, device="cuda").argsort(1)[:, :top_k].int()  # distinct experts a token
        input_ids = torch.randint(0, VOCAB, (m,), device="cuda")
        out["ll_bf16_router, no bias"] = lambda h, w, b: kimi_router_ops.ll_bf16_router(h, w, None, **routing)
        out["router, hash-routed"] = lambda h, w, b: kimi_router_ops.router(
            h, w, b, **routing, input_ids=input_ids, hash_table=table)
        topk = peers["dsv4_topk"]
        if topk is not None and top_k == 6 and n in (256, 384):  # what vLLM's dsv4_topk serves
            gate, name = peers["gate"], "vLLM: ll_bf16 + dsv4_topk"
            if gate is None or not vllm_serves(m, n, k):  # its GateLinear: cuBLAS above M = 16
                gate, name = cublas, "vLLM: cuBLAS + dsv4_topk"
            out[name] = lambda h, w, b: topk(gate(h, w), b, scale)
    return out


def batch_invariant(op, *args, **kwargs):
    """op(...) in batch-invariant mode (captured so: a graph keeps the kernels it captured)."""
    previous = kimi_router_ops.set_batch_invariant(True)
    try:
        return op(*args, **kwargs)
    finally:
        kimi_router_ops.set_batch_invariant(previous)


def run(shapes, m_list, replays, producer_names=None, gemms=(), routers=()):
    layer_us, after_layer_us = after_layer_timer(replays)
    v4 = any(CONFIGS[s][-1] == "sqrtsoftplus" for s in shapes)
    peers = {"gate": vllm_gate(), "dsv4_topk": vllm_dsv4_topk() if v4 else None}

    results = []
    for shape in shapes:
        k, n = CONFIGS[shape][:2]
        weights = weight_copies(n, k, 3 * l2_bytes())
        biases = [torch.randn(n, device="cuda") * 0.1 for _ in weights]
        for m in m_list:
            for producer_name, produce in producers(m, k).items():
                if producer_names and producer_name not in producer_names:
                    continue
                hidden = produce() if produce else torch.randn(m, k, device="cuda").to(torch.bfloat16)
                for consumer_name, consume in consumers(m, CONFIGS[shape], peers, gemms, routers).items():
                    calls = [lambda w=w, b=b, c=consume, p=produce: c(p() if p else hidden, w, b)
                             for w, b in zip(weights, biases)]
                    results.append({
                        "shape": shape, "M": m, "producer": producer_name, "consumer": consumer_name,
                        "after_layer": after_layer_us(calls),
                        "back_to_back": round(graph_time_us(calls, replays=replays), 3),
                    })
                front = fused_fronts(m, CONFIGS[shape]).get(producer_name)
                if front:  # the producer and the router as one op
                    calls = [lambda w=w, b=b: front(w, b) for w, b in zip(weights, biases)]
                    results.append({
                        "shape": shape, "M": m, "producer": producer_name, "consumer": "producer + router in one op",
                        "after_layer": after_layer_us(calls),
                        "back_to_back": round(graph_time_us(calls, replays=replays), 3),
                    })
                if produce:  # the producer alone, both ways
                    results.append({
                        "shape": shape, "M": m, "producer": producer_name, "consumer": "none",
                        "after_layer": after_layer_us([produce] * AFTER_LAYER_CALLS),
                        "back_to_back": round(graph_time_us([produce] * len(weights), replays=replays), 3),
                    })
        del weights
    return results, layer_us


def markdown(report):
    return two_way_markdown(
        report, f"us per (producer, consumer) pair, median of CUDA-graph replays, cold weights; each cell is "
        f"after the layer (back to back). The layer kernel: {report['layer_us']:.1f} us.",
        "shape", ("producer", "consumer"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(DEFAULT_SHAPES), choices=list(SHAPES))
    parser.add_argument("--m", nargs="+", type=int, default=list(M_LIST))
    parser.add_argument("--producers", nargs="+", help="only these producers (none, rms_norm, ...)")
    parser.add_argument("--gemms", nargs="+", default=[], metavar="NAME", choices=[v.name for v in tables.gemm.ALL_VARIANTS],
                        help="also these GEMM kernels by name (tables/gemm.py), each where it computes M")
    parser.add_argument("--routers", nargs="+", default=[], metavar="NAME",
                        choices=[r.name for r in tables.router.ROUTER_VARIANTS],
                        help="also these fused router rows by name (tables/router.py), where they serve")
    args = parse_bench_args(parser)
    results, layer_us = run(args.shapes, args.m, args.replays, args.producers, args.gemms, args.routers)
    report = report_header(layer_us=round(layer_us, 3), results=results)
    save_report(args.out, "chain", report, markdown(report))


if __name__ == "__main__":
    main()
