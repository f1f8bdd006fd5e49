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


# "After the layer": a non-PDL kernel (an elementwise op over LAYER_MIB, about 25 us, which
# also evicts L2) before each timed call, as the rest of a decode layer runs before its router.
LAYER_MIB = 48
AFTER_LAYER_CALLS = 12  # calls in a graph after the layer (fewer copies suffice: the layer evicts L2)


def after_layer_timer(replays: int):
    """(layer_us, time): the layer kernel's own time, and time(thunks) -> us per thunk, each
    behind a layer kernel (the graph's time less the layers'), for the first
    AFTER_LAYER_CALLS thunks."""
    layer_data = torch.ones(LAYER_MIB * 2**20 // 2, device="cuda", dtype=torch.bfloat16)
    layer = lambda: layer_data.mul_(1.0)  # noqa: E731  (a plain ATen kernel: no PDL)
    layer_us = graph_time_us([layer] * AFTER_LAYER_CALLS, replays=replays)

    def time(thunks):
        calls = [f for thunk in thunks[:AFTER_LAYER_CALLS] for f in (layer, thunk)]
        return round(graph_time_us(calls, replays=replays) * 2 - layer_us, 3)

    return layer_us, time


def hbm_read_bandwidth() -> float:
    """Bytes per second of a large read-only reduction (1 GiB, well past L2)."""
    data = torch.ones(2**28, device="cuda", dtype=torch.float32)
    us = graph_time_us([lambda: torch.sum(data)] * 4)
    return data.numel() * 4 / (us * 1e-6)


def empty_node_us() -> float:
    """Per-call cost of a one-element kernel in a graph: the price of one more graph node."""
    tiny = torch.zeros(1, device="cuda")
    return graph_time_us([lambda: tiny.add_(1)] * 20)
