"""python -m kimi_router_ops.bench.front: Kimi-K3's MoE front as an engine runs it.

In Kimi-K3 two GEMMs read AttnRes's output: the gate (N 896, then the routing) and the latent
MoE's down-projection (7168 -> 3584, bf16, 51.4 MB), which vLLM runs beside the gate on a side
stream (`KimiMoE._maybe_overlap_router_and_down_proj`, then FusedMoE routes the logits). Each
arrangement is timed after the layer (a non-PDL kernel before each front, subtracted) and back
to back, in CUDA graphs of one front per copy of the weights (cold). "vLLM's projection" is
K3's down-projection as vLLM runs it on SM90 (its CuTe-DSL skinny GEMM at M = 1..3, cuBLAS
above: tools/build_vllm_skinny.py); where that peer is not built, cuBLAS's, and the rows say so.
- behind our `attn_res`: our router beside the projection (2 streams; a model written against
  this library); our GEMM beside it, then `moe_routing` (vLLM with our plugin); one cuBLAS
  GEMM of gate and projection concatenated, then `moe_routing` (SGLang's arrangement); router
  then the projection on one stream; `router_and_projection` (one grid for both weights);
- behind vLLM's Triton `attn_res` (tools/get_vllm_peers.sh): vLLM as shipped, its `ll_bf16`
  gate beside its projection, then the routing (`moe_routing` standing in for its
  `grouped_topk`: ours is the faster of the two, so the row flatters vLLM);
- the gate and projection without a producer: each projection alone, a plain read of the same
  64 MB (`torch.sum`: the rate HBM gives a stream of this size), our router alone,
  `router_and_projection` alone.
vLLM's kernels come from ../shared/peers and build/peers (kimi_router_ops/bench/peers.py:
PEERS_DIR, PEERS_SRC); each absent one is skipped with the reason. Before timing, each peer's
output is compared with ours (`checks` in the report). Writes <out>/front.json, front.md.
"""

import argparse

import torch
import torch.nn.functional as F

import kimi_router_ops
from .report import parse_bench_args, report_header, save_report, two_way_markdown
from .peers import vllm_attn_res, vllm_down_projection, vllm_gate
from .timing import AFTER_LAYER_CALLS, after_layer_timer, graph_time_us

N, K, LATENT, TOP_K, BLOCKS, EPS = 896, 7168, 3584, 16, 8, 1e-6
M_LIST = (1, 2, 4, 8, 16)


def two_streams(side, gate, project, then=None):
    """gate(h, w, bias) on the current stream beside project(h, p) on `side`, joined, then
    then(gate's result, bias): vLLM's maybe_execute_in_parallel."""
    def front(h, ws):
        w, p, _, bias = ws
        side.wait_stream(torch.cuda.current_stream())
        out = gate(h, w, bias)
        with torch.cuda.stream(side):
            project(h, p)
        torch.cuda.current_stream().wait_stream(side)
        return out if then is None else then(out, bias)
    return front


def fronts(side, project, project_name, gate=None):
    """producer -> {name: fn(hidden, weights)}, weights = (w, p, merged [w; p], bias)."""
    route = lambda logits, bias: kimi_router_ops.moe_routing(logits, bias, TOP_K)  # noqa: E731
    ours = {
        f"router beside {project_name}, 2 streams": two_streams(
            side, lambda h, w, b: kimi_router_ops.router(h, w, b, TOP_K), project),
        f"GEMM beside {project_name}, then moe_routing (vLLM with our plugin)": two_streams(
            side, lambda h, w, b: kimi_router_ops.router_gemm(h, w), project, route),
        "merged cuBLAS GEMM + moe_routing (SGLang's)": lambda h, ws: route(
            torch.mm(h, ws[2].t(), out_dtype=torch.float32)[:, :N], ws[3]),
        f"router, then {project_name} (one stream)": lambda h, ws: (
            kimi_router_ops.router(h, ws[0], ws[3], TOP_K), project(h, ws[1])),
        "router_and_projection": lambda h, ws: kimi_router_ops.router_and_projection(
            h, ws[0], ws[1], ws[3], TOP_K),
    }
    out = {"attn_res": ours}
    if gate is not None:
        out["vLLM attn_res"] = {
            f"vLLM: ll_bf16 beside {project_name}, then routing": two_streams(
                side, lambda h, w, b: gate(h, w), project, route)}
    return out


def peer_checks(m, hidden, attn_res_args, weights, gate, project, vllm_attn):
    """Each peer's output against ours on one input: max |difference| / max |ours|."""
    def rel(theirs, ours):
        return round(((theirs.float() - ours.float()).abs().max() / ours.float().abs().max()).item(), 6)

    w, p = weights[0][0], weights[0][1]
    checks = {"M": m}
    if project is not None:
        checks["projection"] = rel(project(hidden, p), F.linear(hidden, p))
    if gate is not None:
        checks["gate"] = rel(gate(hidden, w), kimi_router_ops.router_gemm(hidden, w))
    if vllm_attn is not None:
        prefix, delta, blocks, *rest = attn_res_args
        checks["attn_res"] = rel(vllm_attn(prefix.clone(), delta, blocks.clone(), *rest),
                                 kimi_router_ops.attn_res(prefix.clone(), delta, blocks.clone(), *rest))
    return checks


def run(m_list, replays):
    layer_us, after_layer_us = after_layer_timer(replays)
    bf = lambda *s: torch.randn(*s, device="cuda").to(torch.bfloat16)  # noqa: E731
    weights = []
    for _ in range(AFTER_LAYER_CALLS):
        w, p = bf(N, K) * 0.01, bf(LATENT, K) * 0.01
        weights.append((w, p, torch.cat([w, p]), torch.randn(N, device="cuda") * 0.1))
    side = torch.cuda.Stream()
    vllm_project, vllm_attn = vllm_down_projection(), vllm_attn_res()
    gate = vllm_gate() if vllm_attn is not None else None  # vLLM's front needs both
    project, project_name = (vllm_project, "vLLM's projection") if vllm_project else (F.linear, "cuBLAS projection")
    results, checks = [], []

    def record(m, producer, name, calls):
        results.append({"M": m, "producer": producer, "front": name, "after_layer": after_layer_us(calls),
                        "back_to_back": round(graph_time_us(calls, replays=replays), 3)})

    for m in m_list:
        gamma = (torch.rand(K, device="cuda") + 0.5).to(torch.bfloat16)
        prefix, delta, blocks, qk = bf(m, K), bf(m, K) * 1e-3, bf(m, BLOCKS, K), bf(K) * 0.05
        attn_res_args = (prefix, delta, blocks, gamma, qk, gamma, BLOCKS, -1, EPS, EPS)
        hidden = bf(m, K)
        checks.append(peer_checks(m, hidden, attn_res_args, weights, gate, vllm_project, vllm_attn))
        producers = {"attn_res": lambda: kimi_router_ops.attn_res(*attn_res_args),
                     "vLLM attn_res": lambda: vllm_attn(*attn_res_args)}
        for producer, arrangements in fronts(side, project, project_name, gate).items():
            make = producers[producer]
            for name, front in arrangements.items():
                record(m, producer, name, [lambda ws=ws, f=front, make=make: f(make(), ws) for ws in weights])
            record(m, producer, f"{producer} alone", [make] * AFTER_LAYER_CALLS)
        alone = {"cuBLAS projection alone": F.linear}
        if vllm_project is not None:
            alone["vLLM's projection alone"] = vllm_project
        for name, fn in alone.items():
            record(m, "none", name, [lambda ws=ws, fn=fn: fn(hidden, ws[1]) for ws in weights])
        record(m, "none", "torch.sum over the same 64 MB", [lambda ws=ws: ws[2].sum() for ws in weights])
        record(m, "none", "router alone", [lambda ws=ws: kimi_router_ops.router(hidden, ws[0], ws[3], TOP_K)
                                           for ws in weights])
        record(m, "none", "router_and_projection", [
            lambda ws=ws: kimi_router_ops.router_and_projection(hidden, ws[0], ws[1], ws[3], TOP_K)
            for ws in weights])
    return results, checks, layer_us


def markdown(report):
    return two_way_markdown(
        report, "Kimi-K3's MoE front (N 896, K 7168, down-projection 3584, top-16, AttnRes 8 blocks), us per "
        f"front, median of CUDA-graph replays, cold weights; each cell is after the layer (back to back). "
        f"The layer kernel: {report['layer_us']:.1f} us.", "producer", ("front",))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", nargs="+", type=int, default=list(M_LIST))
    args = parse_bench_args(parser)
    results, checks, layer_us = run(args.m, args.replays)
    print("peer outputs against ours (max |difference| / max |ours|):", checks)
    report = report_header(layer_us=round(layer_us, 3), checks=checks, results=results)
    save_report(args.out, "front", report, markdown(report))


if __name__ == "__main__":
    main()
