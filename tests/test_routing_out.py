"""The `_out` routing ops: `moe_routing_out` and `router_out` write the caller's tensors
(int32 or int64 ids, any row stride), append fused shared-expert slots and add expert counts.
Against the functional ops bit for bit (kernels and reference), bincount for the counts, on
the fused kernels, the two launches and the reference paths; opcheck, compile, CUDA graphs
(no allocation while capturing), two streams, bad outputs named."""

import pytest
import torch

import kimi_router_ops
from conftest import HAS_CUDA, requires_kernel_gpu
from test_moe_routing import MODEL_CONFIGS, make_logits
from test_router import make_case

DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
ID_DTYPES = [torch.int32, torch.int64]


def buffers(m, width, n, device, id_dtype=torch.int32, spare=0, counts=True):
    """Output buffers as an engine keeps them: rows `spare` columns wider than the call's
    (a view of the first `width`), NaN / -7 where nothing should be left, zeroed counts."""
    weights = torch.full((m, width + spare), float("nan"), device=device)[:, :width]
    ids = torch.full((m, width + spare), -7, dtype=id_dtype, device=device)[:, :width]
    return weights, ids, (torch.zeros(n, dtype=torch.int32, device=device) if counts else None)


def assert_outputs(weights, ids, counts, ref_weights, ref_ids, n, shared, shared_weight, prior=None):
    top_k = ref_ids.shape[1]
    assert torch.equal(weights[:, :top_k], ref_weights)
    assert torch.equal(ids[:, :top_k].long(), ref_ids.long())
    m = ids.shape[0]
    expected_ids = torch.arange(n, n + shared, device=ids.device).expand(m, shared)
    assert torch.equal(ids[:, top_k:].long(), expected_ids)
    assert (weights[:, top_k:] == shared_weight).all()
    if counts is not None:
        expected = torch.bincount(ids.long().flatten().cpu(), minlength=n + shared).int()
        if prior is not None:
            expected += prior
        assert torch.equal(counts.cpu(), expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("config", list(MODEL_CONFIGS))
@pytest.mark.parametrize("m", [1, 5, 16, 40])
@pytest.mark.parametrize("id_dtype", ID_DTYPES)
@pytest.mark.parametrize("shared", [0, 1, 2])
def test_moe_routing_out_matches_moe_routing(device, config, m, id_dtype, shared):
    n, top_k, n_group, topk_group, scale = MODEL_CONFIGS[config]
    logits, bias = make_logits(m, n, device=device, seed=m)
    ref_w, ref_ids = kimi_router_ops.moe_routing(logits, bias, top_k, n_group, topk_group, True, scale)
    weights, ids, counts = buffers(m, top_k + shared, n + shared, device, id_dtype, spare=3)
    prior = torch.arange(n + shared, dtype=torch.int32)  # counts add to what is there
    counts.copy_(prior)
    out = kimi_router_ops.moe_routing_out(logits, bias, top_k, n_group, topk_group, True, scale, topk_weights=weights,
                                          topk_ids=ids, expert_counts=counts, num_fused_shared_experts=shared,
                                          shared_expert_weight=1.0 / scale)
    assert out[0] is weights and out[1] is ids
    assert_outputs(weights, ids, counts, ref_w, ref_ids, n, shared, torch.tensor(1.0 / scale).item(), prior)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("config", list(MODEL_CONFIGS))
@pytest.mark.parametrize("m", [1, 2, 4, 9, 16, 17])  # the fused rows, and the two launches above
@pytest.mark.parametrize("id_dtype", ID_DTYPES)
@pytest.mark.parametrize("shared", [0, 1])
def test_router_out_matches_router(device, config, m, id_dtype, shared):
    n, top_k, n_group, topk_group, scale = MODEL_CONFIGS[config]
    x, w, bias = make_case(m, n, 7168, top_k, n_group, topk_group, device=device, seed=m)
    ref_w, ref_ids, ref_logits = kimi_router_ops.router(x, w, bias, top_k, n_group, topk_group, True, scale)
    weights, ids, counts = buffers(m, top_k + shared, n + shared, device, id_dtype)
    logits = torch.full((m, n + 5), float("nan"), device=device)[:, :n]
    kimi_router_ops.router_out(x, w, bias, top_k, n_group, topk_group, True, scale, topk_weights=weights,
                               topk_ids=ids, logits=logits, expert_counts=counts, num_fused_shared_experts=shared)
    assert torch.equal(logits, ref_logits)
    assert_outputs(weights, ids, counts, ref_w, ref_ids, n, shared, 1.0)


@pytest.mark.parametrize("device", DEVICES)
def test_without_counts_and_widest(device):
    """No expert counts; top_k + shared slots of 32 (a warp's lanes, the kernels' most: the
    same bits as moe_routing's kernel) and of 33 (the reference on every device: on a GPU
    within its rounding of the kernel's weights)."""
    n, m = 256, 6
    logits, bias = make_logits(m, n, device=device)
    for top_k, shared in ((30, 2), (31, 2)):
        ref_w, ref_ids = kimi_router_ops.moe_routing(logits, bias, top_k)
        weights, ids, _ = buffers(m, top_k + shared, n + shared, device, counts=False)
        kimi_router_ops.moe_routing_out(logits, bias, top_k, topk_weights=weights, topk_ids=ids,
                                        num_fused_shared_experts=shared, shared_expert_weight=0.25)
        if device == "cuda" and top_k + shared > 32:
            torch.testing.assert_close(weights[:, :top_k], ref_w, rtol=1e-5, atol=0)
            ref_w = weights[:, :top_k]
        assert_outputs(weights, ids, None, ref_w, ref_ids, n, shared, 0.25)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("id_dtype", ID_DTYPES)
def test_hash_routed(device, id_dtype):
    from test_hash_routing import make_ids, make_table

    n, top_k, m = 256, 6, 9
    x, w, _ = make_case(m, n, 4096, top_k, 1, 1, device=device, bias_kind=None)
    table, input_ids = make_table(n, top_k, device=device), make_ids(m, device=device)
    ref = kimi_router_ops.router(x, w, None, top_k, scoring="sqrtsoftplus", input_ids=input_ids, hash_table=table)
    weights, ids, counts = buffers(m, top_k + 1, n + 1, device, id_dtype)
    logits = torch.empty(m, n, device=device)
    kimi_router_ops.router_out(x, w, None, top_k, scoring="sqrtsoftplus", input_ids=input_ids, hash_table=table,
                               topk_weights=weights, topk_ids=ids, logits=logits, expert_counts=counts,
                               num_fused_shared_experts=1)
    assert torch.equal(logits, ref[2])
    assert_outputs(weights, ids, counts, ref[0], ref[1], n, 1, 1.0)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    n, top_k = 256, 8
    for m in (0, 3):
        logits, bias = make_logits(m, n, device=device)
        weights, ids, counts = buffers(m, top_k + 1, n + 1, device, torch.int64)
        torch.library.opcheck(torch.ops.kimi.moe_routing_out.default, (logits, bias, top_k, 8, 4, True, 2.5),
                              dict(topk_weights=weights, topk_ids=ids, expert_counts=counts,
                                   num_fused_shared_experts=1, shared_expert_weight=0.4))
        x, w, bias = make_case(m, n, 512, top_k, 8, 4, device=device)
        weights, ids, counts = buffers(m, top_k, n, device)
        torch.library.opcheck(torch.ops.kimi.router_out.default, (x, w, bias, top_k, 8, 4, True, 2.5),
                              dict(topk_weights=weights, topk_ids=ids, expert_counts=counts,
                                   logits=torch.empty(m, n, device=device)))


@pytest.mark.parametrize("device", DEVICES)
def test_compiled(device):
    """Under torch.compile the ops stay in the graph (mutations functionalized) and write the
    same values."""
    n, top_k, m = 384, 8, 4
    x, w, bias = make_case(m, n, 1024, top_k, 1, 1, device=device)

    def route(x, weights, ids, logits, counts):
        kimi_router_ops.router_out(x, w, bias, top_k, topk_weights=weights, topk_ids=ids, logits=logits,
                                   expert_counts=counts, num_fused_shared_experts=1)
        return weights * 2, ids  # a use of the written tensors after the op

    torch.compiler.reset()
    compiled = torch.compile(route, fullgraph=True, dynamic=True)
    eager, fresh = buffers(m, top_k + 1, n + 1, device), buffers(m, top_k + 1, n + 1, device)
    lg_eager, lg_fresh = torch.empty(m, n, device=device), torch.empty(m, n, device=device)
    twice_e, _ = route(x, *eager[:2], lg_eager, eager[2])
    twice_c, _ = compiled(x, *fresh[:2], lg_fresh, fresh[2])
    assert torch.equal(twice_e, twice_c)
    for a, b in zip((*eager, lg_eager), (*fresh, lg_fresh)):
        assert torch.equal(a, b)


def bad_cases(device):
    n, top_k, m = 64, 4, 3
    logits, _ = make_logits(m, n, device=device, bias_kind=None)
    weights, ids, counts = buffers(m, top_k, n, device)
    cases = {
        "weights dtype": (dict(topk_weights=weights.double()), "topk_weights must be torch.float32"),
        "ids dtype": (dict(topk_ids=ids.float()), "topk_ids must be torch.int32 or torch.int64"),
        "weights shape": (dict(topk_weights=weights[:, :3]), "topk_weights must have shape [3, 4]"),
        "ids width without shared slots": (dict(num_fused_shared_experts=1), "topk_weights must have shape [3, 5]"),
        "ids rows": (dict(topk_ids=ids[:2]), "topk_ids must have shape [3, 4]"),
        "counts shape": (dict(expert_counts=counts[:10]), "expert_counts must have shape [64]"),
        "counts dtype": (dict(expert_counts=counts.long()), "expert_counts must be torch.int32"),
        "weights strided": (dict(topk_weights=torch.empty(top_k, m, device=device).t()),
                            "topk_weights must have a unit stride along its last dimension"),
        "shared count": (dict(num_fused_shared_experts=-1), "num_fused_shared_experts must be >= 0, got -1"),
        "shared weight": (dict(shared_expert_weight=float("inf")), "shared_expert_weight must be finite"),
    }
    if device == "cuda":
        cases["weights device"] = (dict(topk_weights=weights.cpu()), "topk_weights must be on cuda:0, got cpu")
    base = dict(topk_weights=weights, topk_ids=ids, expert_counts=counts)
    return logits, top_k, {name: ({**base, **change}, message) for name, (change, message) in cases.items()}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["eager", "compiled"])
def test_bad_outputs(device, mode):
    logits, top_k, cases = bad_cases(device)
    x, w, _ = make_case(logits.shape[0], logits.shape[1], 256, top_k, 1, 1, device=device, bias_kind=None)
    for name, (kwargs, message) in cases.items():
        for op, args in ((torch.ops.kimi.moe_routing_out.default, (logits, None, top_k)),
                         (torch.ops.kimi.router_out.default, (x, w, None, top_k))):
            if op is torch.ops.kimi.router_out.default:
                kwargs = {**kwargs, "logits": torch.empty(x.shape[0], w.shape[0], device=device)}
            call = op if mode == "eager" else torch.compile(op, backend="eager", fullgraph=True)
            torch.compiler.reset()
            with pytest.raises(RuntimeError, match=message.replace("[", r"\[").replace("]", r"\]")):
                call(*args, **kwargs)
            assert op.__name__ or name  # the process and device stay usable: the next case runs
    weights = torch.empty(x.shape[0], top_k, device=device)
    ids = torch.empty(x.shape[0], top_k, dtype=torch.int32, device=device)
    for logits_out, message in ((torch.empty(x.shape[0], w.shape[0], dtype=torch.bfloat16, device=device),
                                 "logits must be torch.float32"),
                                (torch.empty(x.shape[0], 5, device=device), r"logits must have shape \[3, 64\]")):
        with pytest.raises(RuntimeError, match=message):
            kimi_router_ops.router_out(x, w, None, top_k, topk_weights=weights, topk_ids=ids, logits=logits_out)


@requires_kernel_gpu
@pytest.mark.parametrize("config", list(MODEL_CONFIGS))
@pytest.mark.parametrize("m", [1, 4, 16])
def test_cuda_graph_no_allocation(config, m):
    """Captured with static buffers, a call allocates nothing (torch's allocator stats) and
    each replay routes the tokens now in the input; the counts add up over replays."""
    n, top_k, n_group, topk_group, scale = MODEL_CONFIGS[config]
    x, w, bias = make_case(m, n, 7168, top_k, n_group, topk_group, device="cuda", seed=m)
    weights, ids, counts = buffers(m, top_k + 1, n + 1, "cuda", torch.int64)
    logits = torch.empty(m, n, device="cuda")

    def call():
        kimi_router_ops.router_out(x, w, bias, top_k, n_group, topk_group, True, scale, topk_weights=weights,
                                   topk_ids=ids, logits=logits, expert_counts=counts, num_fused_shared_experts=1)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()  # warm-up: the handoff buffers, the kernels' modules
    torch.cuda.current_stream().wait_stream(side)
    # A capture registers the CUDA generator, whose graph state torch allocates while any
    # graph holds it: one kept alive, the measured capture finds it there.
    warm = torch.cuda.CUDAGraph()
    with torch.cuda.graph(warm):
        call()
    graph = torch.cuda.CUDAGraph()
    before = torch.cuda.memory_stats()["allocation.all.allocated"]
    with torch.cuda.graph(graph):
        call()
    assert torch.cuda.memory_stats()["allocation.all.allocated"] == before
    counts.zero_()
    for seed in (1, 2):
        x.copy_(make_case(m, n, 7168, top_k, n_group, topk_group, device="cuda", seed=100 + seed)[0])
        graph.replay()
        ref = kimi_router_ops.router(x, w, bias, top_k, n_group, topk_group, True, scale)
        assert torch.equal(logits, ref[2])
        assert torch.equal(weights[:, :top_k], ref[0]) and torch.equal(ids[:, :top_k].int(), ref[1])
    assert counts.sum().item() == 2 * m * (top_k + 1)
    assert counts[n].item() == 2 * m


@requires_kernel_gpu
def test_two_streams_share_counts():
    """Calls on two streams at once, adding into one counts tensor: atomic adds, nothing lost."""
    n, top_k, m = 256, 8, 16
    logits_a, bias = make_logits(m, n, device="cuda", seed=1)
    logits_b, _ = make_logits(m, n, device="cuda", seed=2)
    counts = torch.zeros(n, dtype=torch.int32, device="cuda")
    outs = []
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for stream in streams:
        stream.wait_stream(torch.cuda.current_stream())
    for logits, stream in zip((logits_a, logits_b), streams):
        with torch.cuda.stream(stream):
            for _ in range(10):
                weights, ids, _ = buffers(m, top_k, n, "cuda", counts=False)
                kimi_router_ops.moe_routing_out(logits, bias, top_k, 8, 4, topk_weights=weights, topk_ids=ids,
                                                expert_counts=counts)
            outs.append(ids)
    torch.cuda.synchronize()
    expected = 10 * (torch.bincount(outs[0].long().flatten(), minlength=n)
                     + torch.bincount(outs[1].long().flatten(), minlength=n))
    assert torch.equal(counts.long(), expected)
