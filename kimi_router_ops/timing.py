"""GPU timing shared by the main job and the benchmarks: CUDA-graph replay, CUDA events."""

import statistics

import torch


def graph_time_us(calls, replays: int = 30, warmup: int = 3) -> float:
    """Median microseconds per call of `calls` (a list of thunks) captured in one CUDA graph.

    Each thunk is one call (usually on its own copy of the weights, so that a graph of
    several calls reads more than L2 holds and every call sees cold weights).
    """
    for fn in calls:  # load kernels, warm allocator and cuBLAS outside the capture
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in calls:
            fn()
    for _ in range(warmup):
        graph.replay()
    start = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(replays)]
    for s, e in zip(start, end):
        s.record()
        graph.replay()
        e.record()
    torch.cuda.synchronize()
    per_replay_ms = statistics.median(s.elapsed_time(e) for s, e in zip(start, end))
    del graph
    return per_replay_ms * 1e3 / len(calls)


def weight_copies(n: int, k: int, min_bytes: int, device="cuda", most: int = 256) -> list:
    """Enough distinct bf16 [n, k] weights to cover `min_bytes` (at least 2, at most `most`:
    a graph of more calls takes long to capture, and 256 copies of the smallest shape timed,
    64 x 2048, still read more than an H200's L2 holds)."""
    count = min(most, max(2, -(-min_bytes // (n * k * 2))))
    return [torch.randn(n, k, device=device).to(torch.bfloat16) for _ in range(count)]


def l2_bytes(device=None) -> int:
    return torch.cuda.get_device_properties(device).L2_cache_size
