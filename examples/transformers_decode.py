"""A DeepSeek-V3- or Qwen3-MoE-shaped transformers model, decoding with and without the
router ops.

    python examples/transformers_decode.py                    # GPU if present, else a tiny model on the CPU
    python examples/transformers_decode.py --model qwen3-moe --tokens 64 --batch 8

The model has the router of DeepSeek-V3 (hidden 7168, 256 experts in 8 groups, 4 kept,
top-8, scale 2.5; sigmoid) or of Qwen3-235B-A22B (hidden 4096, 128 experts, top-8,
renormalized; softmax) but random weights, few layers and small experts, so that it fits
anywhere and the router is a visible part of a decode step. It generates greedily with
transformers' own router, then with `kimi_router_ops.integrations.transformers.patch(model)`,
checks that both produce the same tokens, and prints the time per decode step of each.
"""

import argparse
import time

import torch
import transformers

from kimi_router_ops.integrations import transformers as kimi_tf


def build_model(name: str, device: str, small: bool):
    return {"deepseek-v3": deepseek_v3, "qwen3-moe": qwen3_moe}[name](small).to(device=device, dtype=torch.bfloat16).eval()


def qwen3_moe(small: bool):
    hidden, experts, top_k = (256, 64, 8) if small else (4096, 128, 8)
    config = transformers.Qwen3MoeConfig(
        vocab_size=1024, hidden_size=hidden, intermediate_size=2 * hidden, moe_intermediate_size=64,
        num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8, head_dim=64,
        num_experts=experts, num_experts_per_tok=top_k, norm_topk_prob=True, max_position_embeddings=1024,
        pad_token_id=0, eos_token_id=1, bos_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(config)
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__ == "Qwen3MoeTopKRouter":
                module.weight.normal_(0, hidden ** -0.5)
    return model


def deepseek_v3(small: bool):
    hidden, experts, groups, kept, top_k = (256, 64, 4, 2, 6) if small else (7168, 256, 8, 4, 8)
    config = transformers.DeepseekV3Config(
        vocab_size=1024, hidden_size=hidden, intermediate_size=2 * hidden, moe_intermediate_size=64,
        num_hidden_layers=4, first_k_dense_replace=1, num_attention_heads=8, num_key_value_heads=8,
        n_shared_experts=1, n_routed_experts=experts, n_group=groups, topk_group=kept,
        num_experts_per_tok=top_k, routed_scaling_factor=2.5, kv_lora_rank=64, q_lora_rank=128,
        qk_rope_head_dim=32, v_head_dim=64, qk_nope_head_dim=64, max_position_embeddings=1024,
        pad_token_id=0, eos_token_id=1, bos_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(config)
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__ == "DeepseekV3TopkRouter":
                module.weight.normal_(0, hidden ** -0.5)
                module.e_score_correction_bias.uniform_(-0.05, 0.05)
    return model


def decode_step_ms(model, prompt, tokens: int, repeats: int = 3):
    """Median over `repeats` of (time to generate prompt + tokens - time for prompt + 1) / (tokens - 1)."""
    def run(n):
        if prompt.is_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        out = model.generate(prompt, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        if prompt.is_cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start, out

    run(tokens)  # warm-up
    samples = []
    for _ in range(repeats):
        full, out = run(tokens)
        first, _ = run(1)
        samples.append((full - first) / (tokens - 1) * 1e3)
    return sorted(samples)[len(samples) // 2], out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["deepseek-v3", "qwen3-moe"], default="deepseek-v3")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--small", action="store_true", help="hidden 256, 64 experts (default on the CPU)")
    args = parser.parse_args()
    small = args.small or args.device == "cpu"
    model = build_model(args.model, args.device, small)
    prompt = torch.randint(2, 1024, (args.batch, 16), generator=torch.Generator().manual_seed(1))
    prompt = prompt.to(args.device)
    with torch.no_grad():
        unpatched_ms, expected = decode_step_ms(model, prompt, args.tokens)
        routers = kimi_tf.patch(model)
        patched_ms, tokens = decode_step_ms(model, prompt, args.tokens)
    same = torch.equal(tokens, expected)
    name = torch.cuda.get_device_name() if args.device != "cpu" else "CPU"
    print(f"{name}, transformers {transformers.__version__}, torch {torch.__version__}; "
          f"{'small' if small else args.model + '-shaped'} router, {routers} MoE layers patched, "
          f"batch {args.batch}, {args.tokens} tokens")
    if args.device == "cpu":
        # CPU bf16 matmuls swing with thread scheduling: their times say nothing about the op.
        print(f"  on the CPU (no GPU found): both decode the same tokens: {same}; no speed is "
              "reported (the GPU kernels are unused here; run this on an sm_90 or sm_100 GPU)")
    else:
        print(f"  decode step: transformers' router {unpatched_ms:.3f} ms, kimi_router_ops {patched_ms:.3f} ms "
              f"({unpatched_ms / patched_ms:.2f}x); same tokens: {same}")
    if not same:
        raise SystemExit("the patched model generated different tokens")


if __name__ == "__main__":
    main()
