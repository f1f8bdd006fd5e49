"""python -m kimi_router_ops.bench.front: Kimi-K3's MoE front as an engine runs it.

In Kimi-K3 two GEMMs read AttnRes's output: the gate (N 896, then the routing) and the latent
MoE's down-projection (7168 -> 3584, bf16, 51.4 MB), which vLLM runs beside the router on a
side stream. Each arrangement is timed after the layer (a non-PDL kernel before each front,
subtracted) and back to back, in CUDA graphs of one front per copy of the weights (cold):
- `attn_res` then: our router and cuBLAS's projection on a side stream (vLLM's arrangement,
  our kernels); the same with vLLM's `ll_bf16` gate and our routing (when ../shared/peers'
  vllm_ll is built: PEERS_DIR, default ./build/peers, its scripts in PEERS_SRC, default
  ../shared/peers); one cuBLAS GEMM of gate and
  projection concatenated, then `moe_routing` (SGLang's arrangement); router then cuBLAS on
  one stream; `router_and_projection` (one grid for both weight streams, then the routing);
- the gate and projection without a producer: cuBLAS's projection alone, a plain read of the
  same 64 MB (`torch.sum`: the rate HBM gives a stream of this size), our router alone,
  `router_and_projection` alone.
Writes <out>/front.json, front.md.
"""

import argparse

import torch
import torch.nn.functional as F

import kimi_router_ops
from .report import parse_bench_args, report_header, save_report, two_way_markdown
from .peers import vllm_gate
from .timing import AFTER_LAYER_CALLS, after_layer_timer, graph_time_us

N, K, LATENT, TOP_K, BLOCKS, EPS = 896, 7168, 3584, 16, 8, 1e-6
M_LIST = (1, 2, 4, 8, 16)


def fronts(m, side, gate=None):
    """name -> fn(hidden, weights) where weights = (w, p, merged [w; p], bias)."""
    routing = dict(top_k=TOP_K)

    def two_streams(route):
        def front(h, ws):
            w, p, _, bias = ws
            side.wait_stream(torch.cuda.current_stream())
            route(h, w, bias)
            with torch.cuda.stream(side):
                F.linear(h, p)
            torch.cuda.current_stream().wait_stream(side)
        return front

    out = {
        "router + cuBLAS projection, 2 streams": two_streams(
            lambda h, w, b: kimi_router_ops.router(h, w, b, **routing)),
    }
    if gate is not None:
        out["vLLM gate + moe_routing + cuBLAS projection, 2 streams"] = two_streams(
            lambda h, w, b: kimi_router_ops.moe_routing(gate(h, w), b, **routing))
    out["merged cuBLAS GEMM + moe_routing"] = lambda h, ws: kimi_router_ops.moe_routing(
        torch.mm(h, ws[2].t(), out_dtype=torch.float32)[:, :N], ws[3], **routing)
    out["router, then cuBLAS projection"] = lambda h, ws: (
        kimi_router_ops.router(h, ws[0], ws[3], **routing), F.linear(h, ws[1]))
    out["router_and_projection"] = lambda h, ws: kimi_router_ops.router_and_projection(
        h, ws[0], ws[1], ws[3], **routing)
    return out


def run(m_list, replays):
    layer_us, after_layer_us = after_layer_timer(replays)
    bf = lambda *s: torch.randn(*s, device="cuda").to(torch.bfloat16)  # noqa: E731
    weights = []
    for _ in range(AFTER_LAYER_CALLS):
        w, p = bf(N, K) * 0.01, bf(LATENT, K) * 0.01
        weights.append((w, p, torch.cat([w, p]), torch.randn(N, device="cuda") * 0.1))
    side = torch.cuda.Stream()
    gate = vllm_gate()
    results = []

    def record(m, producer, name, calls):
        results.append({"M": m, "producer": producer, "front": name, "after_layer": after_layer_us(calls),
                        "back_to_back": round(graph_time_us(calls, replays=replays), 3)})

    for m in m_list:
        gamma = (torch.rand(K, device="cuda") + 0.5).to(torch.bfloat16)
        prefix, delta, blocks, qk = bf(m, K), bf(m, K) * 1e-3, bf(m, BLOCKS, K), bf(K) * 0.05
        hidden = bf(m, K)

        def attn_res():
            return kimi_router_ops.attn_res(prefix, delta, blocks, gamma, qk, gamma, BLOCKS, -1, EPS, EPS)

        for name, front in fronts(m, side, gate).items():
            record(m, "attn_res", name, [lambda ws=ws, f=front: f(attn_res(), ws) for ws in weights])
        record(m, "none", "cuBLAS projection alone", [lambda ws=ws: F.linear(hidden, ws[1]) for ws in weights])
        record(m, "none", "torch.sum over the same 64 MB", [lambda ws=ws: ws[2].sum() for ws in weights])
        record(m, "none", "router alone", [lambda ws=ws: kimi_router_ops.router(hidden, ws[0], ws[3], top_k=TOP_K)
                                           for ws in weights])
        record(m, "none", "router_and_projection", [
            lambda ws=ws: kimi_router_ops.router_and_projection(hidden, ws[0], ws[1], ws[3], TOP_K)
            for ws in weights])
        record(m, "attn_res", "attn_res alone", [attn_res] * AFTER_LAYER_CALLS)
    return results, layer_us


def markdown(report):
    return two_way_markdown(
        report, "Kimi-K3's MoE front (N 896, K 7168, down-projection 3584, top-16, AttnRes 8 blocks), us per "
        f"front, median of CUDA-graph replays, cold weights; each cell is after the layer (back to back). "
        f"The layer kernel: {report['layer_us']:.1f} us.", "producer", ("front",))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", nargs="+", type=int, default=list(M_LIST))
    args = parse_bench_args(parser)
    results, layer_us = run(args.m, args.replays)
    report = report_header(layer_us=round(layer_us, 3), results=results)
    save_report(args.out, "front", report, markdown(report))


if __name__ == "__main__":
    main()
