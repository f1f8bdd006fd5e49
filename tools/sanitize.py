"""Every kernel variant over odd shapes, every fused router row, the routing op's kernels,
the gate-and-projection kernels, the norm kernels and the AttnRes kernel, for compute-sanitizer
(tools/device_run.sh sanitize).

    compute-sanitizer --tool memcheck --error-exitcode 1 python3 tools/sanitize.py

Inputs are made on the CPU and copied over, so the GPU work under the tool is our kernels
plus copies; each result is checked against the CPU reference as well.
"""

import argparse
import re
import sys

import torch

import kimi_router_ops
from kimi_router_ops import tables
from kimi_router_ops.testing import dot_error, gemm_row_linked, near_tie, reference_router, reference_routing

N_LIST = (1, 3, 17, 895)
# Odd K for the scalar-load kernels; multiples of 8 (chunk and split tails) for all of them.
K_LIST = (1, 7, 8, 40, 1000, 7169, 7176)
# Fused router: (N, K, top_k, n_group, topk_group), an odd small case and the real configs
# (DeepSeek-V3, Kimi-K2, Kimi-K3, Qwen3-235B, DeepSeek-V2).
ROUTER_CASES = ((17, 40, 3, 1, 1), (256, 7168, 8, 8, 4), (384, 7168, 8, 1, 1), (896, 7168, 16, 1, 1),
                (128, 4096, 8, 1, 1), (160, 5120, 6, 8, 3))
# (scoring, bias): sigmoid with each bias kind, softmax without a bias and with an fp32 one,
# sqrtsoftplus with an fp32 one.
SCORINGS = (("sigmoid", None), ("sigmoid", torch.float32), ("sigmoid", torch.bfloat16),
            ("softmax", None), ("softmax", torch.float32), ("sqrtsoftplus", torch.float32))


def make_bias(n, dtype):
    return None if dtype is None else (torch.randn(n) * 0.1).to(dtype)
# Norm: (M, K) with K past one step of 16-byte loads (8192), odd K (scalar loads), one row.
NORM_SHAPES = ((1, 7168), (16, 7168), (3, 9000), (2, 7169), (5, 1), (1, 40))
# AttnRes: (M, H, R, num_blocks, block_write_idx, delta, output norm): the model's calls, the
# most blocks, a write into a source, H not a multiple of a CTA's share, M past a wave.
ATTN_RES_CASES = ((1, 7168, 9, 8, -1, True, True), (16, 7168, 9, 8, 8, False, True), (3, 7168, 16, 15, 15, True, False),
                  (2, 1000, 4, 3, 1, True, True), (300, 64, 2, 0, 0, True, True), (5, 8192, 3, 2, -1, False, False))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="variants whose name matches this regular expression "
                        "(\"moe_routing\", \"norm\": those kernels alone)")
    parser.add_argument("--shapes", nargs="+", help="N,K pairs instead of the full list")
    args = parser.parse_args()
    # The same inputs every run, so that a failure reproduces.
    torch.manual_seed(0)
    shapes = [(n, k) for n in N_LIST for k in K_LIST] + [(896, 7168)]
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split(",")) for s in args.shapes]
    calls = 0
    worst = 0.0
    for v in tables.gemm.ALL_VARIANTS:
        if not re.search(args.only, v.name):
            continue
        if not gemm_row_linked(v.name):
            print(f"{v.name}: not in this build (a lab row: KIMI_ROUTER_OPS_LAB=1 builds it)")
            continue
        # Tensor-core rows: a second, partial token tile too (grid z).
        tiles = {v.kernel.tokens + 3} if v.kernel.token_tiles else set()
        for m in sorted({1, v.tokens} | tiles):
            for n, k in shapes:
                if k % 8 and 1 not in v.kernel.vecs:
                    continue  # 16-byte loads only (tests/test_cuda.py checks the error)
                if k % v.kernel.vecs[-1]:
                    continue  # fp32 weights: 16-byte loads only
                if getattr(v.kernel, "k", 0) not in (0, k):
                    continue  # K compiled in: that K only (tests/test_cuda.py checks the error)
                x = torch.randn(m, k).to(torch.bfloat16)
                w = torch.randn(n, k).to(getattr(torch, v.kernel.weight_dtype))
                # bf16 output changes only the final store: check it on a subset of shapes.
                out_dtypes = (torch.float32, torch.bfloat16) if n in (17, 896) else (torch.float32,)
                for out_dtype in out_dtypes:
                    out = kimi_router_ops.router_gemm_with_variant(x.cuda(), w.cuda(), v.name, out_dtype)
                    err = dot_error(out, x, w)
                    worst = max(worst, err if out_dtype == torch.float32 else err / 800)
                    calls += 1
    for r in tables.router.ROUTER_VARIANTS:
        if not re.search(args.only, r.name):
            continue
        for m in sorted({r.m_lo, r.m_hi}):
            for n, k, top_k, n_group, topk_group in ROUTER_CASES:
                k = r.k_only or k  # K compiled in: that K
                if n > r.n_max:
                    continue
                x = torch.randn(m, k).to(torch.bfloat16)
                w = (torch.randn(n, k) * k ** -0.5).to(getattr(torch, r.weight_dtype))
                for scoring, bias_dtype in SCORINGS:
                    bias = make_bias(n, bias_dtype)
                    route = (top_k, n_group, topk_group, True, 2.5)
                    cuda_bias = None if bias is None else bias.cuda()
                    weights, ids, logits = kimi_router_ops.router_with_variant(
                        x.cuda(), w.cuda(), cuda_bias, *route, r.name, scoring
                    )
                    ref_weights, ref_ids, _, masked, group_scores = reference_router(x, w, bias, *route, scoring)
                    worst = max(worst, dot_error(logits, x, w))
                    check_routing(f"{r.name} m={m} n={n} top_k={top_k} groups={n_group}/{topk_group} "
                                  f"{scoring} bias={bias_dtype}", weights, ids,
                                  (ref_weights, ref_ids, masked, group_scores), top_k, topk_group)
                    calls += 1
    if re.search(args.only, "moe_routing"):
        for m in (1, 5, 40, 257):
            for n, _, top_k, n_group, topk_group in ROUTER_CASES + ((1000, 0, 32, 1, 1),):
                for dtype in (torch.float32, torch.bfloat16):
                    logits = (torch.randn(m, n) * 2).to(dtype)
                    for scoring, bias_dtype in SCORINGS:
                        bias = make_bias(n, bias_dtype)
                        route = (top_k, n_group, topk_group, True, 2.5)
                        weights, ids = kimi_router_ops.moe_routing(
                            logits.cuda(), None if bias is None else bias.cuda(), *route, scoring)
                        check_routing(f"moe_routing m={m} n={n} {dtype} {scoring} bias={bias_dtype}",
                                      weights, ids, reference_routing(logits, bias, *route, scoring), top_k,
                                      topk_group)
                        calls += 1
    if re.search(args.only, "hash"):
        # Hash-routed layers: the routing kernel and every fused row that serves DeepSeek-V4's
        # shape, int32 and int64 indices, with out-of-range tokens and experts (flagged: expert
        # 0, NaN weight; memcheck says nothing is read outside the table).
        bf16_rows = [r for r in tables.router.ROUTER_VARIANTS if r.n_min <= 384 <= r.n_max and r.weight_dtype == "bfloat16"]
        for n, k, m_list, rows in ((384, 7168, (1, 2, 16, 40), [None] + bf16_rows), (1000, 64, (5,), [None])):
            for m in m_list:
                for dtype in (torch.int32, torch.int64):
                    table = torch.randint(0, n, (50, 6), dtype=dtype)
                    tokens = torch.randint(0, 50, (m,), dtype=dtype)
                    bad_table, bad_tokens = table.clone(), tokens.clone()
                    bad_table[tokens[0], 2] = n + 7
                    bad_tokens[-1] = 50 if m > 1 else bad_tokens[-1]
                    x = torch.randn(m, k).to(torch.bfloat16)
                    w = (torch.randn(n, k) * k ** -0.5).to(torch.bfloat16)
                    for row in rows:
                        if row is not None and not row.m_lo <= m <= row.m_hi:
                            continue
                        name = row and row.name
                        for tab, tok in ((table, tokens), (bad_table, bad_tokens)):
                            extra = (name,) if name else ()
                            call = kimi_router_ops.router_with_variant if name else kimi_router_ops.router
                            args_ = (x.cuda(), w.cuda(), None, 6, 1, 1, True, 1.5, *extra)
                            weights, ids, logits = call(*args_, scoring="sqrtsoftplus", input_ids=tok.cuda(),
                                                        hash_table=tab.cuda())
                            scores = torch.nn.functional.softplus(logits.cpu().double()).sqrt()
                            good = (tok >= 0) & (tok < 50)
                            expected = tab.long()[tok.clamp(0, 49)]
                            ok = good[:, None] & (expected < n)
                            want = scores.gather(1, torch.where(ok, expected, 0))
                            want = want / want.sum(-1, keepdim=True) * 1.5
                            rows_ok = ok.all(1)
                            if not (torch.equal(ids.cpu().long()[rows_ok], expected[rows_ok])
                                    and torch.allclose(weights.cpu().double()[rows_ok], want[rows_ok], rtol=1e-5)
                                    and weights.cpu()[~rows_ok].isnan().all()):
                                print(f"hash routing {name or 'router'} m={m} n={n} {dtype}: differs from the "
                                      "reference")
                                sys.exit(1)
                            calls += 1
    if re.search(args.only, "routing_out"):
        # The _out ops: int64 ids, a shared-expert slot, expert counts and buffers with wider
        # rows, over the M buckets of the fused rows, the two launches (M = 20: our GEMM
        # kernels, not cuBLAS, whose own kernels the tools flag) and the routing kernel.
        for m in (1, 2, 4, 9, 16, 20):
            for n, k, top_k, n_group, topk_group in ROUTER_CASES[1:4]:
                x = torch.randn(m, k).to(torch.bfloat16).cuda()
                w = (torch.randn(n, k) * k ** -0.5).to(torch.bfloat16).cuda()
                bias = make_bias(n, torch.float32).cuda()
                route = (top_k, n_group, topk_group, True, 2.5)
                weights = torch.empty(m, top_k + 5, device="cuda")[:, :top_k + 1]
                ids = torch.empty(m, top_k + 5, dtype=torch.int64, device="cuda")[:, :top_k + 1]
                counts, logits = torch.zeros(n + 1, dtype=torch.int32, device="cuda"), torch.empty(m, n, device="cuda")
                extra = dict(topk_weights=weights, topk_ids=ids, expert_counts=counts, num_fused_shared_experts=1)
                kimi_router_ops.router_out(x, w, bias, *route, logits=logits, **extra)
                want = kimi_router_ops.router(x, w, bias, *route)
                first = ids.clone()
                kimi_router_ops.moe_routing_out(logits, bias, *route, **extra)
                good = (torch.equal(first[:, :top_k].int(), want[1]) and torch.equal(weights[:, :top_k], want[0])
                        and (ids[:, top_k] == n).all() and torch.equal(ids, first)
                        and torch.equal(counts.long(), 2 * torch.bincount(ids.flatten(), minlength=n + 1)))
                if not good:
                    print(f"routing_out m={m} n={n}: differs from router")
                    sys.exit(1)
                calls += 2
    if re.search(args.only, "gate_bias"):
        # router_gemm and router with a gate bias (gpt-oss's shape), bf16 and fp32 weights.
        for w_dtype in (torch.bfloat16, torch.float32):
            x_dtypes = (torch.bfloat16, torch.float32) if w_dtype == torch.float32 else (torch.bfloat16,)
            for m, x_dtype in ((m, x) for m in (1, 5, 16, 40) for x in x_dtypes):
                x = torch.randn(m, 2880).to(x_dtype)
                w = (torch.randn(128, 2880) * 2880 ** -0.5).to(w_dtype)
                b = (torch.randn(128) * 0.1).to(w_dtype)
                logits = kimi_router_ops.router_gemm(x.cuda(), w.cuda(), b.cuda())
                worst = max(worst, dot_error(logits.cpu().double() - b.double(), x, w))
                weights, ids, _ = kimi_router_ops.router(x.cuda(), w.cuda(), None, 4, scoring="softmax",
                                                         gate_bias=b.cuda())
                ref_logits = x.double() @ w.double().t() + b.double()
                check_routing(f"router gate_bias m={m} {w_dtype} {x_dtype}", weights, ids,
                              reference_routing(ref_logits, None, 4, 1, 1, True, 1.0, "softmax"), 4, 1)
                calls += 2
    if re.search(args.only, "projection"):
        # router_and_projection: every Projection row (a partial last tile of N and L, K with
        # padded vectors), the two-op path, and Kimi-K3's front.
        for m in (1, 2, 3):
            for n, latent, k in ((17, 40, 1032), (896, 3584, 7168)):
                x = torch.randn(m, k).to(torch.bfloat16)
                w, p = ((torch.randn(rows, k) * k ** -0.5).to(torch.bfloat16) for rows in (n, latent))
                weights, ids, logits, proj = kimi_router_ops.router_and_projection(x.cuda(), w.cuda(), p.cuda(), None, 4)
                worst = max(worst, dot_error(logits.cpu(), x, w))
                exact = x.double() @ p.double().t()
                if not ((proj.cpu().double() - exact).abs() <= exact.abs() * 2.0**-8 + 1e-3).all():
                    print(f"router_and_projection m={m} n={n} l={latent}: projection differs from the reference")
                    sys.exit(1)
                check_routing(f"router_and_projection m={m} n={n}", weights, ids,
                              reference_routing(x.double() @ w.double().t(), None, 4, 1, 1, True, 1.0, "sigmoid"), 4, 1)
                calls += 2
    if re.search(args.only, "norm"):
        for m, k in NORM_SHAPES:
            x, residual, weight = torch.randn(m, k).to(torch.bfloat16), torch.randn(m, k).to(torch.bfloat16), torch.rand(k).to(torch.bfloat16)
            for offset in (0, 1):  # a view one element in: misaligned, scalar loads
                xs = torch.randn(m, k + offset).to(torch.bfloat16)[:, offset:]
                got = kimi_router_ops.rms_norm(xs.cuda(), weight.cuda(), 1e-6).cpu()
                normed, summed = kimi_router_ops.fused_add_rms_norm(x.cuda(), residual.cuda(), weight.cuda(), 1e-6)
                ref_normed, ref_summed = kimi_router_ops.fused_add_rms_norm(x, residual, weight, 1e-6)
                bad = (ulps(got, kimi_router_ops.rms_norm(xs, weight, 1e-6)) > 1 or ulps(normed.cpu(), ref_normed) > 1
                       or not torch.equal(summed.cpu(), ref_summed))
                if bad:
                    print(f"norm m={m} k={k}: differs from the CPU reference")
                    sys.exit(1)
                calls += 2
    if re.search(args.only, "attn_res"):
        for m, h, r, nb, idx, with_delta, with_norm in ATTN_RES_CASES:
            prefix, blocks = torch.randn(m, h).to(torch.bfloat16), torch.randn(m, r, h).to(torch.bfloat16)
            delta = torch.randn(m, h).to(torch.bfloat16) if with_delta else None
            weights = [(torch.rand(h) + 0.5).to(torch.bfloat16) for _ in range(3)]
            norm_weight = weights[2] if with_norm else None
            args = (nb, idx, 1e-6, 1e-6)
            on_gpu = [None if t is None else t.cuda() for t in (prefix, delta, blocks, weights[0], weights[1], norm_weight)]
            got = kimi_router_ops.attn_res(*on_gpu, *args).cpu()
            ref = kimi_router_ops.attn_res(prefix, delta, blocks, weights[0], weights[1], norm_weight, *args)
            # Two roundings to bf16 apart, or fp32 noise against the row's size where the mix cancels.
            close = (got.double() - ref.double()).abs() <= 2**-7 * ref.double().abs() + 1e-4 * ref.double().square().mean().sqrt()
            if not close.all() or not torch.equal(on_gpu[0].cpu(), prefix) or not torch.equal(on_gpu[2].cpu(), blocks):
                print(f"attn_res m={m} h={h} blocks={nb} write={idx}: differs from the CPU reference")
                sys.exit(1)
            # attn_res_router: exactly attn_res, then the router, on Kimi-K3's 896 experts.
            w = (torch.randn(896, h) * h ** -0.5).to(torch.bfloat16).cuda()
            bias = make_bias(896, torch.float32).cuda()
            inputs = [None if t is None else t.clone() for t in on_gpu]
            fused = kimi_router_ops.attn_res_router(*on_gpu, *args, w, bias, 16)
            hidden = kimi_router_ops.attn_res(*inputs, *args)
            two_ops = (hidden, *kimi_router_ops.router(hidden, w, bias, 16))
            same = all(torch.equal(a, b) for a, b in zip(fused, two_ops))
            if not same or not torch.equal(on_gpu[0], inputs[0]) or not torch.equal(on_gpu[2], inputs[2]):
                print(f"attn_res_router m={m} h={h} blocks={nb} write={idx}: differs from attn_res then router")
                sys.exit(1)
            calls += 2
    torch.cuda.synchronize()
    print(f"{calls} kernel calls, worst fp32 error {worst:.2e} (relative to sum |x w|)")
    if worst > 1e-5:
        sys.exit(1)


def check_routing(what, weights, ids, reference, top_k, topk_group):
    """Exit with a report unless the ids match the float64 reference (up to its near-ties:
    a wrong handoff gives garbage) and the weights are within 1e-5. Two picks within the
    kernel's sigmoid or softmax error of each other may come in the other order (docs/api.md), so
    weights are compared in id order."""
    ref_weights, ref_ids, masked, group_scores = reference
    m = ids.shape[0]
    got_ids, got_order = ids.cpu().long().sort(1)
    ref_sorted, ref_order = ref_ids.sort(1)
    same = (got_ids == ref_sorted).all(1)
    tied = torch.tensor([near_tie(group_scores[t], topk_group) or near_tie(masked[t], top_k)
                         for t in range(m)], dtype=torch.bool)
    got_w, ref_w = weights.cpu().double().gather(1, got_order), ref_weights.gather(1, ref_order)
    if not (same | tied).all() or not torch.allclose(got_w[same], ref_w[same], rtol=1e-5):
        print(f"{what}: routing differs from the float64 reference")
        for t in range(m):
            print(f"  token {t}: ids {ids[t].tolist()}, reference {ref_ids[t].tolist()}, "
                  f"largest weight difference {(weights.cpu()[t] - ref_weights[t]).abs().max().item():.2e}")
        sys.exit(1)


def ulps(a, b):
    """Largest distance in bf16 units in the last place (same-sign finite values)."""
    return (a.view(torch.int16).int() - b.view(torch.int16).int()).abs().max().item()


if __name__ == "__main__":
    main()
