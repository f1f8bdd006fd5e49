"""A Kimi-K3-shaped MoE router in eager mode, under torch.compile and in a CUDA graph.

    python examples/moe_router.py                   # Kimi-K3 shape on the GPU, small on the CPU
    python examples/moe_router.py --model kimi-k2 --tokens 4

Routing as in DeepSeek-V3-style models: sigmoid scores, a per-expert score-correction bias
that steers the choice (not the weights), top-k experts, weights renormalized over the
chosen experts and scaled. The three ways of running must choose the same experts.
"""

import argparse

import torch
from torch import nn

import kimi_router_ops

MODELS = {  # hidden size, experts, experts per token
    "kimi-k3": (7168, 896, 16),
    "kimi-k2": (7168, 384, 8),
    "deepseek-v3": (7168, 256, 8),
}


class MoERouter(nn.Module):
    def __init__(self, hidden: int, experts: int, top_k: int, scaling: float = 2.5, device=None):
        super().__init__()
        self.top_k = top_k
        self.scaling = scaling
        self.gate = kimi_router_ops.RouterLinear(hidden, experts, device=device)
        self.register_buffer("e_score_correction_bias", torch.zeros(experts, device=device))

    def forward(self, hidden_states: torch.Tensor):
        scores = torch.sigmoid(self.gate(hidden_states))  # fp32 logits straight from the op
        chosen = torch.topk(scores + self.e_score_correction_bias, self.top_k, dim=-1).indices
        weights = scores.gather(-1, chosen)
        weights = weights / weights.sum(dim=-1, keepdim=True) * self.scaling
        return chosen, weights


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=list(MODELS), default="kimi-k3")
    parser.add_argument("--tokens", type=int, default=1)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", help="hidden 256, experts 64 (default on the CPU)")
    args = parser.parse_args()
    hidden, experts, top_k = MODELS[args.model]
    if args.small or args.device == "cpu":
        hidden, experts = 256, 64
    torch.manual_seed(0)
    router = MoERouter(hidden, experts, top_k, device=args.device)
    with torch.no_grad():
        router.e_score_correction_bias.uniform_(-0.05, 0.05)
    x = torch.randn(args.tokens, hidden, device=args.device).to(torch.bfloat16)

    with torch.no_grad():
        eager = router(x)
        compiled = torch.compile(router, fullgraph=True)(x)
        results = {"eager": eager, "torch.compile": compiled}
        if args.device != "cpu":
            static_x = x.clone()
            router(static_x)  # load the kernels before capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                graphed = router(static_x)
            graph.replay()
            torch.cuda.synchronize()
            results["CUDA graph"] = graphed

    print(f"{args.model}: {args.tokens} token(s), hidden {hidden}, {experts} experts, top-{top_k}, "
          f"on {args.device} (kernel {kimi_router_ops.chosen_variant(args.tokens, experts, hidden)} on sm_90)")
    for name, (chosen, weights) in results.items():
        same = torch.equal(chosen, eager[0])
        close = torch.allclose(weights, eager[1], rtol=1e-5, atol=1e-6)
        print(f"  {name:<14} experts {chosen[0].tolist()}  same as eager: {same and close}")
        if not (same and close):
            raise SystemExit(f"{name} chose different experts than eager mode")


if __name__ == "__main__":
    main()
