"""The norm in front of an MoE layer and its router, in eager mode, under torch.compile and
in a CUDA graph, the way a model should run them.

    python examples/moe_router.py                   # Kimi-K3 shape on the GPU, small on the CPU
    python examples/moe_router.py --model deepseek-v3 --tokens 4

The producer -> router pattern: `fused_add_rms_norm` (residual add + RMSNorm) makes the
router's hidden states, and `ll_bf16_router` turns them into expert ids and weights in one
launch (DeepSeek-V3-style routing: sigmoid scores, a score-correction bias that steers the
choice, grouped top-k, renormalized and scaled weights). Both kernels are launched with
programmatic dependent launch: the router kernel starts while the norm still runs and, for
one token, loads its first weights before it waits for the norm's output. A torch kernel in
front of the router (F.rms_norm, say) never lets it start early. The three ways of running
must choose the same experts.
"""

import argparse

import torch
from torch import nn

import kimi_router_ops

MODELS = {  # hidden size, experts, experts per token, groups, groups kept, weight scale
    "kimi-k3": (7168, 896, 16, 1, 1, 1.0),
    "kimi-k2": (7168, 384, 8, 1, 1, 2.827),
    "deepseek-v3": (7168, 256, 8, 8, 4, 2.5),
}


class MoEGate(nn.Module):
    """The post-attention norm and the router of one MoE layer."""

    def __init__(self, hidden, experts, top_k, n_group, topk_group, scaling, eps=1e-6, device=None):
        super().__init__()
        self.route = (top_k, n_group, topk_group, True, scaling)
        self.eps = eps
        self.norm_weight = nn.Parameter(torch.ones(hidden, dtype=torch.bfloat16, device=device))
        self.gate = kimi_router_ops.RouterLinear(hidden, experts, device=device)
        self.register_buffer("e_score_correction_bias", torch.zeros(experts, device=device))

    def forward(self, hidden_states: torch.Tensor, residual: torch.Tensor):
        # The producer: residual add + RMSNorm, a PDL kernel (it lets the router launch now).
        normed, residual = kimi_router_ops.fused_add_rms_norm(hidden_states, residual, self.norm_weight, self.eps)
        # The router: logits, scores, grouped top-k and weights in one launch.
        weights, ids, _ = kimi_router_ops.ll_bf16_router(
            normed, self.gate.weight, self.e_score_correction_bias, *self.route
        )
        return ids, weights, normed, residual


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=list(MODELS), default="kimi-k3")
    parser.add_argument("--tokens", type=int, default=1)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", help="hidden 256, experts 64 (default on the CPU)")
    args = parser.parse_args()
    if args.tokens < 1:
        parser.error(f"--tokens must be at least 1, got {args.tokens}")
    hidden, experts, top_k, n_group, topk_group, scaling = MODELS[args.model]
    small = args.small or args.device == "cpu"
    if small:
        hidden, experts = 256, 64
    torch.manual_seed(0)
    layer = MoEGate(hidden, experts, top_k, n_group, topk_group, scaling, device=args.device)
    with torch.no_grad():
        layer.e_score_correction_bias.uniform_(-0.05, 0.05)
        layer.norm_weight.uniform_(0.5, 1.5)
    x = torch.randn(args.tokens, hidden, device=args.device).to(torch.bfloat16)
    residual = torch.randn(args.tokens, hidden, device=args.device).to(torch.bfloat16)

    with torch.no_grad():
        eager = layer(x, residual)
        compiled = torch.compile(layer, fullgraph=True)(x, residual)
        results = {"eager": eager, "torch.compile": compiled}
        if args.device != "cpu":
            static = (x.clone(), residual.clone())
            layer(*static)  # load the kernels before capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                graphed = layer(*static)
            graph.replay()
            torch.cuda.synchronize()
            results["CUDA graph"] = graphed

    shape = f"a small {args.model}-like router" if small else args.model
    print(f"{shape}: {args.tokens} token(s), hidden {hidden}, {experts} experts, top-{top_k}, on {args.device}")
    if args.device == "cpu":
        print("  (no GPU: the reference ops run; on an sm_90 or sm_100 GPU the router is "
              f"{kimi_router_ops.chosen_router_variant(args.tokens, experts, hidden, top_k, n_group, topk_group)})")
    else:
        major, minor = torch.cuda.get_device_capability()
        kernel = kimi_router_ops.chosen_router_variant(args.tokens, experts, hidden, top_k, n_group, topk_group,
                                                       major * 10 + minor)
        print(f"  router: {kernel}")
    for name, (chosen, weights, _, _) in results.items():
        same = torch.equal(chosen, eager[0])
        close = torch.allclose(weights, eager[1], rtol=1e-5, atol=1e-6)
        print(f"  {name:<14} experts {chosen[0].tolist()}  same as eager: {same and close}")
        if not (same and close):
            raise SystemExit(f"{name} chose different experts than eager mode")


if __name__ == "__main__":
    main()
