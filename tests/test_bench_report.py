"""The benchmark reports render from their JSON (the timing itself needs a GPU)."""

from kimi_router_ops import bench, bench_chain


def test_bench_markdown_has_a_row_per_m_and_the_kernel_column():
    results = [
        {"shape": "kimi-k3", "N": 896, "K": 7168, "M": m, "impl": impl, "us": us, "floor_us": 2.9,
         "x_floor": us / 2.9, "kernel": "m1_prefetch_r2:vec8" if m == 1 else "cublas"}
        for m in (1, 64)
        for impl, us in (("ll_bf16_gemm (auto)", 4.9), ("torch.mm (fp32 out)", 7.9))
    ]
    report = {"gpu": "GPU", "driver": "d", "torch": "t", "cuda": "c", "commit": "abc", "date": "now",
              "hbm_read_TBps": 4.3, "empty_node_us": 1.0, "replays": 30,
              "host_overhead_us": {"op": 8.0}, "results": results}
    text = bench.markdown(report)
    assert "| 1 | 4.90 (1.69x) | 7.90 (2.72x) | m1_prefetch_r2:vec8 |" in text
    assert "| 64 | 4.90 (1.69x) | 7.90 (2.72x) | cublas |" in text


def test_chain_markdown_signs_the_change():
    results = [{"shape": "kimi-k2", "impl": "RMSNorm alone", "us": 1.4}] + [
        {"shape": "kimi-k2", "impl": name, "us": us}
        for name, us in zip(bench_chain.ROUTERS, (4.0, 4.0, 5.0, 5.7, 7.7))
    ]
    text = bench_chain.markdown({"gpu": "GPU", "torch": "t", "commit": "abc", "results": results})
    assert text.splitlines()[-1].endswith("| -20.0% |")
