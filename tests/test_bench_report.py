"""The benchmark reports render from their JSON (the timing itself needs a GPU)."""

import torch

import kimi_router_ops
from kimi_router_ops import bench, bench_chain, bench_router


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


def test_chain_markdown_signs_the_change_and_the_overlap():
    def cell(pair, alone):
        return {"alone": alone, "pair": pair, "overlap": round(1.5 + alone - pair, 3)}

    row = {"shape": "kimi-k2", "M": 1, "norm alone": 1.5, "F.rms_norm alone": 2.0, "baseline pair": 8.0}
    row.update({name: cell(6.0, 3.0) for name in bench_chain.routers(1)})
    row["prefetch (auto)"], row["no prefetch"] = cell(4.0, 2.5), cell(5.0, 2.5)
    text = bench_chain.markdown({"gpu": "GPU", "torch": "t", "commit": "abc", "date": "d", "results": [row]})
    line = next(line for line in text.splitlines() if line.startswith("| kimi-k2"))
    assert "| 4.00 (2.50, +0.00) |" in line and "| 5.00 (2.50, -1.00) |" in line
    assert line.endswith("| 8.00 | -20.0% | +1.50 | 2.00x |")


def test_router_bench_baseline_routes_like_the_op():
    """The benchmark's torch-ops routing computes what ll_bf16_router computes."""
    for config, (_, n, top_k, n_group, topk_group, scale, scoring) in bench_router.CONFIGS.items():
        x = torch.randn(4, 512).to(torch.bfloat16)
        w = (torch.randn(n, 512) * 512 ** -0.5).to(torch.bfloat16)
        bias = torch.randn(n) * 0.05 if scoring == "sigmoid" else None
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
