"""The benchmark reports render from their JSON (the timing itself needs a GPU)."""

import torch

import kimi_router_ops
from kimi_router_ops.bench import chain as bench_chain, gemm as bench, router as bench_router


def fake_report(impls, ms=(1, 64)):
    results = [
        {"shape": "kimi-k3", "N": 896, "K": 7168, "M": m, "impl": impl, "us": us, "serial_us": us + 1,
         "floor_us": 2.9, "x_floor": us / 2.9, "kernel": "m1_prefetch_r4_t256:vec8" if m == 1 else "cublas"}
        for m in ms
        for impl, us in impls
    ]
    return {"gpu": "GPU", "driver": "d", "torch": "t", "cuda": "c", "commit": "abc", "date": "now",
            "hbm_read_TBps": 4.3, "empty_node_us": 1.0, "replays": 30,
            "host_overhead_us": {"op": 8.0}, "results": results}


def test_bench_markdown_has_a_row_per_m_and_the_kernel_column():
    text = bench.markdown(fake_report((("ll_bf16_gemm (auto)", 4.9), ("torch.mm (fp32 out)", 7.9))))
    assert "| 1 | 4.90 (1.69x) | 7.90 (2.72x) | 5.90 | m1_prefetch_r4_t256:vec8 |" in text
    assert "| 64 | 4.90 (1.69x) | 7.90 (2.72x) | 5.90 | cublas |" in text


def test_sweep_markdown_ranks_forced_variants_per_case():
    impls = (("ll_bf16_gemm (auto)", 4.9), ("torch.mm (fp32 out)", 7.9),
             ("forced slow", 6.0), ("forced fast", 4.0), ("forced middle", 5.0))
    text = bench.sweep_markdown(fake_report(impls, ms=(1,)), top=2)
    rows = [line for line in text.splitlines() if line.startswith("| kimi-k3 | 1 |")]
    assert rows == [
        "| kimi-k3 | 1 | 4.90 (m1_prefetch_r4_t256:vec8) | 7.90 | 4.00 fast | 5.00 middle |",
        "| kimi-k3 | 1 | 5.90 (m1_prefetch_r4_t256:vec8) | 8.90 | 5.00 fast | 6.00 middle |",
    ]


def test_chain_markdown_puts_after_the_layer_first():
    results = [{"shape": "kimi-k3", "M": m, "producer": "attn_res nb=8", "consumer": "ll_bf16_router",
                "after_layer": 6.5 + m, "back_to_back": 5.25} for m in (1, 16)]
    results.append({"shape": "kimi-k3", "M": 1, "producer": "none", "consumer": "ll_bf16_gemm",
                    "after_layer": 4.0, "back_to_back": 3.0})
    text = bench_chain.markdown({"gpu": "GPU", "torch": "t", "commit": "abc", "date": "d", "layer_us": 25.0,
                                 "results": results})
    lines = text.splitlines()
    assert "| producer | consumer | M = 1 | M = 16 |" in lines
    assert "| attn_res nb=8 | ll_bf16_router | 7.50 (5.25) | 22.50 (5.25) |" in lines
    assert "| none | ll_bf16_gemm | 4.00 (3.00) |  |" in lines


def test_router_bench_baseline_routes_like_the_op():
    """The benchmark's torch-ops routing computes what ll_bf16_router computes."""
    for config, (_, n, top_k, n_group, topk_group, scale, scoring) in bench_router.CONFIGS.items():
        x = torch.randn(4, 512).to(torch.bfloat16)
        w = (torch.randn(n, 512) * 512 ** -0.5).to(torch.bfloat16)
        bias = torch.randn(n) * 0.05 if scoring != "softmax" else None
        weights, ids, logits = kimi_router_ops.ll_bf16_router(x, w, bias, top_k, n_group, topk_group, True, scale,
                                                              scoring)
        ref_weights, ref_ids = bench_router.torch_routing(logits, bias, top_k, n_group, topk_group, scale, scoring)
        for t in range(4):
            assert set(ids[t].tolist()) == set(ref_ids[t].tolist()), config
        torch.testing.assert_close(weights.sort(-1).values, ref_weights.sort(-1).values)


def test_router_markdown_has_the_extra_cost_and_speedup_columns():
    results = [{"config": "kimi-k2", "M": 1, "impl": impl, "us": us, "serial_us": us + 1}
               for impl, us in (("ll_bf16_router", 3.0), ("ll_bf16_gemm alone", 2.25),
                                ("gemm + torch routing, eager", 40.0), ("gemm + torch routing, compiled", 12.0))]
    text = bench_router.markdown({"gpu": "GPU", "torch": "t", "commit": "abc", "date": "now", "results": results})
    assert text.splitlines()[-1] == "| kimi-k2 | 1 | 3.00 (4.00) | 2.25 (3.25) | 40.00 (41.00) | 12.00 (13.00) | +0.75 | 4.00x |"


class _SameStream:
    """torch.cuda's stream calls as no-ops: the front benchmark's arrangements run on the CPU."""

    def wait_stream(self, other):
        pass


def test_front_arrangements_route_like_the_router(monkeypatch):
    """Every arrangement bench.front times computes the router's routing of the same hidden
    states (and vLLM's, with a stand-in gate): a row that passed the wrong weight or top_k
    would time some other front."""
    import contextlib

    from kimi_router_ops.bench import front as bench_front

    monkeypatch.setattr(torch.cuda, "current_stream", lambda: _SameStream())
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    mm = torch.mm  # its out_dtype form is CUDA-only: fp32 sums of the bf16 products here
    monkeypatch.setattr(torch, "mm", lambda a, b, out_dtype: mm(a.to(out_dtype), b.to(out_dtype)))
    torch.manual_seed(0)
    n, k, latent = bench_front.N, 256, 64
    h = torch.randn(3, k).to(torch.bfloat16)
    w, p = (torch.randn(n, k) * k ** -0.5).to(torch.bfloat16), (torch.randn(latent, k) * 0.1).to(torch.bfloat16)
    ws = (w, p, torch.cat([w, p]), torch.randn(n) * 0.1)
    want_weights, want_ids, _ = kimi_router_ops.router(h, w, ws[3], bench_front.TOP_K)
    projected = []
    arrangements = bench_front.fronts(_SameStream(), lambda x, q: projected.append(q) or x @ q.t(), "projection",
                                      gate=lambda x, weight: kimi_router_ops.router_gemm(x, weight))
    assert set(arrangements) == {"attn_res", "vLLM attn_res"}
    names = [name for group in arrangements.values() for name in group]
    assert len(names) == 6
    for group in arrangements.values():
        for name, front in group.items():
            out = front(h, ws)
            weights, ids = (out[0][0], out[0][1]) if isinstance(out[0], tuple) else (out[0], out[1])
            assert torch.equal(ids.sort(-1).values, want_ids.sort(-1).values), name
            torch.testing.assert_close(weights.sort(-1).values, want_weights.sort(-1).values, msg=name)
    assert all(q is p for q in projected) and len(projected) == 4  # the rows that run a projection
