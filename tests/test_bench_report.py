"""The benchmark reports render from their JSON (the timing itself needs a GPU)."""

from kimi_router_ops import bench, bench_chain


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


def test_chain_markdown_signs_the_change():
    results = [{"shape": "kimi-k2", "impl": "RMSNorm alone", "us": 1.4}] + [
        {"shape": "kimi-k2", "impl": name, "us": us}
        for name, us in zip(bench_chain.ROUTERS, (4.0, 4.0, 5.0, 5.7, 7.7))
    ]
    text = bench_chain.markdown({"gpu": "GPU", "torch": "t", "commit": "abc", "results": results})
    assert text.splitlines()[-1].endswith("| -20.0% |")
