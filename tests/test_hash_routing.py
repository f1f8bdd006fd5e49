"""Hash-routed layers (DeepSeek-V4's first ones): ids = hash_table[input_ids], weights the
scores at those ids, renormalized and scaled, the bias unused (vLLM 0.33's fused_topk_bias
formula), in the routing op and the router op (fused kernels and the two launches): against
the float64 formula, int32 and int64 indices, any layout, every scoring, opcheck, compile,
CUDA graphs, bad input (an error on the CPU) and out-of-range indices on a GPU (expert 0,
NaN weight, never a read outside the table)."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import kimi_router_ops
from kimi_router_ops import tables
from conftest import HAS_CUDA, call_in, requires_kernel_gpu
from test_moe_routing import make_logits
from test_router import make_case

DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
INDEX_DTYPES = [torch.int32, torch.int64]
SCORINGS = ["sqrtsoftplus", "sigmoid", "softmax"]
VOCAB = 1000


def make_table(n, top_k, vocab=VOCAB, dtype=torch.int32, device="cpu", seed=0):
    """A hash table as DeepSeek-V4's tid2eid: each token's top_k distinct experts."""
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(n, generator=g)[:top_k] for _ in range(vocab)]).to(dtype).to(device)


def make_ids(m, vocab=VOCAB, dtype=torch.int64, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed + 1)
    return torch.randint(0, vocab, (m,), generator=g).to(dtype).to(device)


def hash_formula(logits, input_ids, table, renormalize, scale, scoring):
    """vLLM's fused_topk_bias with a hash table, in float64 (softplus as torch computes it)."""
    logits = logits.double().cpu()
    scores = {"sigmoid": logits.sigmoid, "softmax": lambda: logits.softmax(-1),
              "sqrtsoftplus": lambda: F.softplus(logits).sqrt()}[scoring]()
    ids = table.long().cpu()[input_ids.long().cpu()]
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights * scale, ids


def assert_hash_routed(out, logits, input_ids, table, renormalize=True, scale=1.0, scoring="sqrtsoftplus"):
    weights, ids = out[0], out[1]
    ref_w, ref_ids = hash_formula(logits, input_ids, table, renormalize, scale, scoring)
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    assert torch.equal(ids.long().cpu(), ref_ids)  # the table's order
    torch.testing.assert_close(weights.double().cpu(), ref_w, rtol=1e-5, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scoring", SCORINGS)
@pytest.mark.parametrize("ids_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("table_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("m", [1, 5, 40])
def test_routing_op_matches_vllms_formula(device, scoring, ids_dtype, table_dtype, m):
    n, top_k = (256, 6) if m != 5 else (384, 6)
    logits, bias = make_logits(m, n, device=device, seed=m)
    table = make_table(n, top_k, dtype=table_dtype, device=device)
    input_ids = make_ids(m, dtype=ids_dtype, device=device, seed=m)
    for renormalize, scale in ((True, 1.5), (False, 2.5)):
        out = kimi_router_ops.moe_routing(logits, bias, top_k, renormalize=renormalize, routed_scaling_factor=scale,
                                          scoring=scoring, input_ids=input_ids, hash_table=table)
        assert_hash_routed(out, logits, input_ids, table, renormalize, scale, scoring)
        # The bias does not enter a hash-routed layer.
        unbiased = kimi_router_ops.moe_routing(logits, None, top_k, renormalize=renormalize,
                                               routed_scaling_factor=scale, scoring=scoring, input_ids=input_ids,
                                               hash_table=table)
        assert all(torch.equal(a, b) for a, b in zip(out, unbiased))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(4096, 256), (7168, 384), (7168, 256)])  # V4-Flash, V4-Pro, a wide Flash
@pytest.mark.parametrize("m", [1, 2, 4, 16, 33])
def test_router_matches_the_routing_op(device, shape, m):
    """The router (fused kernels at M <= 16 on the GPU, the two launches above): logits as
    the unhashed router's, ids and weights bit for bit the routing op's on them."""
    k, n = shape
    x, w, bias = make_case(m, n, k, 6, 1, 1, device=device, seed=m)
    table = make_table(n, 6, device=device, seed=k)
    input_ids = make_ids(m, device=device, seed=m)
    out = kimi_router_ops.router(x, w, bias, 6, routed_scaling_factor=1.5, scoring="sqrtsoftplus",
                                 input_ids=input_ids, hash_table=table)
    plain = kimi_router_ops.router(x, w, bias, 6, routed_scaling_factor=1.5, scoring="sqrtsoftplus")
    assert torch.equal(out[2], plain[2])
    routed = kimi_router_ops.moe_routing(out[2], bias, 6, routed_scaling_factor=1.5, scoring="sqrtsoftplus",
                                         input_ids=input_ids, hash_table=table)
    assert torch.equal(out[0], routed[0]) and torch.equal(out[1], routed[1])
    assert_hash_routed(out, out[2], input_ids, table, True, 1.5)


@requires_kernel_gpu
@pytest.mark.parametrize("row", tables.router.ROUTER_VARIANTS, ids=lambda r: r.name)
def test_every_fused_row(row):
    """Each fused row, forced, hash-routed at both ends of its M range, with both index dtypes."""
    n = max(row.n_min, 256 if row.n_max >= 256 else row.n_max)
    for m in sorted({row.m_lo, row.m_hi}):
        x, w, bias = make_case(m, n, row.k_only or 4096, 6, 1, 1, device="cuda", seed=m)
        w = w.to(getattr(torch, row.weight_dtype))
        for dtype in INDEX_DTYPES:
            table = make_table(n, 6, dtype=dtype, device="cuda", seed=m)
            input_ids = make_ids(m, dtype=dtype, device="cuda", seed=m)
            out = kimi_router_ops.router_with_variant(x, w, bias, 6, 1, 1, True, 1.5, row.name, "sqrtsoftplus",
                                                      None, input_ids, table)
            routed = kimi_router_ops.moe_routing(out[2], bias, 6, routed_scaling_factor=1.5, scoring="sqrtsoftplus",
                                                 input_ids=input_ids, hash_table=table)
            assert torch.equal(out[0], routed[0]) and torch.equal(out[1], routed[1])
            assert_hash_routed(out, out[2], input_ids, table, True, 1.5)


@pytest.mark.parametrize("device", DEVICES)
def test_any_layout(device):
    """input_ids with a stride, a table whose columns are strided and one read at an offset:
    the same routing as contiguous ones."""
    logits, _ = make_logits(7, 256, device=device)
    table = make_table(256, 6, dtype=torch.int64, device=device)
    input_ids = make_ids(7, device=device)
    expected = kimi_router_ops.moe_routing(logits, None, 6, scoring="sqrtsoftplus", input_ids=input_ids,
                                           hash_table=table)
    strided_ids = torch.stack([input_ids, input_ids], 1)[:, 0]
    strided_table = table.t().contiguous().t()
    offset_table = torch.cat([table[:, :1], table], 1)[:, 1:]
    for ids, tab in ((strided_ids, table), (input_ids, strided_table), (input_ids, offset_table)):
        out = kimi_router_ops.moe_routing(logits, None, 6, scoring="sqrtsoftplus", input_ids=ids, hash_table=tab)
        assert all(torch.equal(a, b) for a, b in zip(out, expected))


def bad_hash_calls(device):
    logits = torch.zeros(3, 16, device=device)
    ids = torch.tensor([0, 1, 2], device=device)
    table = make_table(16, 2, vocab=4, device=device)
    return {
        "ids without table": ((logits, None, 2, 1, 1, True, 1.0, "sigmoid", ids, None), "input_ids and hash_table go "
                              "together .*got input_ids without hash_table"),
        "table without ids": ((logits, None, 2, 1, 1, True, 1.0, "sigmoid", None, table), "input_ids and hash_table go together .*got hash_table without "
                              "input_ids"),
        "ids float": ((logits, None, 2, 1, 1, True, 1.0, "sigmoid", ids.float(), table),
                      "input_ids must be torch.int32 or torch.int64, got torch.float32"),
        "table int16": ((logits, None, 2, 1, 1, True, 1.0, "sigmoid", ids, table.short()),
                        "hash_table must be torch.int32 or torch.int64, got torch.int16"),
        "ids wrong length": ((logits, None, 2, 1, 1, True, 1.0, "sigmoid", ids[:2], table),
                             r"input_ids must have shape \[M\]=\[3\], got \[2\]"),
        "ids 2-D": ((logits, None, 2, 1, 1, True, 1.0, "sigmoid", ids[None], table), r"input_ids must have shape"),
        "table not top_k wide": ((logits, None, 3, 1, 1, True, 1.0, "sigmoid", ids, table),
                                 r"hash_table must have shape \[V, top_k=3\] with V >= 1, got \[4, 2\]"),
        "table 1-D": ((logits, None, 2, 1, 1, True, 1.0, "sigmoid", ids, table[0]), "hash_table must have shape"),
        "table empty": ((logits, None, 2, 1, 1, True, 1.0, "sigmoid", ids, table[:0]), "hash_table must have shape .*with V >= 1"),
    }


def cpu_range_errors():
    logits = torch.zeros(3, 16)
    table = make_table(16, 2, vocab=4)
    bad_expert = table.clone()
    bad_expert[2, 1] = 16
    negative_expert = table.clone()
    negative_expert[1, 0] = -1
    return {
        "token past the table": ((logits, None, 2, 1, 1, True, 1.0, "sigmoid", torch.tensor([0, 4, 1]), table),
                                 r"input_ids must be in \[0, V=4\) \(hash_table's rows\), got 4 at 1"),
        "negative token": ((logits, None, 2, 1, 1, True, 1.0, "sigmoid", torch.tensor([-1, 0, 1]), table),
                           r"input_ids must be in .*got -1 at 0"),
        "expert past N": ((logits, None, 2, 1, 1, True, 1.0, "sigmoid", torch.tensor([0, 1, 2]), bad_expert),
                          r"hash_table must hold expert ids in \[0, N=16\), got 16 at \[2, 1\]"),
        "negative expert": ((logits, None, 2, 1, 1, True, 1.0, "sigmoid", torch.tensor([1, 1, 1]), negative_expert),
                            r"hash_table must hold expert ids .*got -1 at \[1, 0\]"),
    }


@pytest.mark.parametrize("device", DEVICES + ["compiled"])
@pytest.mark.parametrize("case", list(bad_hash_calls("cpu")))
def test_bad_input(device, case):
    args, message = bad_hash_calls("cpu" if device == "compiled" else device)[case]
    with pytest.raises(RuntimeError, match="moe_routing: " + message):
        call_in(device, torch.ops.kimi.moe_routing.default, *args)


@pytest.mark.parametrize("mode", ["cpu", "compiled"])
@pytest.mark.parametrize("case", list(cpu_range_errors()))
def test_out_of_range_is_an_error_on_the_cpu(mode, case):
    args, message = cpu_range_errors()[case]
    with pytest.raises(RuntimeError, match="moe_routing: " + message):
        call_in(mode, torch.ops.kimi.moe_routing.default, *args)
    x, w, _ = make_case(3, 16, 64, 2, 1, 1)
    with pytest.raises(RuntimeError, match="router: " + message):
        kimi_router_ops.router(x, w, None, 2, input_ids=args[8], hash_table=args[9])


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (none visible)")
def test_tensors_on_another_device_are_an_error():
    logits = torch.zeros(3, 16, device="cuda")
    table = make_table(16, 2, vocab=4)
    with pytest.raises(RuntimeError, match="hash_table must be on the device of logits"):
        kimi_router_ops.moe_routing(logits, None, 2, input_ids=torch.tensor([0, 1, 2], device="cuda"),
                                    hash_table=table)
    with pytest.raises(RuntimeError, match="input_ids must be on the device of router_weight"):
        x, w, _ = make_case(3, 16, 64, 2, 1, 1, device="cuda")
        kimi_router_ops.router(x, w, None, 2, input_ids=torch.tensor([0, 1, 2]), hash_table=table.cuda())


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU (none visible)")
@pytest.mark.parametrize("n", [256, 1100])  # the routing kernel; the reference on the GPU (N > 1024)
@pytest.mark.parametrize("dtype", INDEX_DTYPES)
def test_out_of_range_on_a_gpu_is_flagged(n, dtype):
    """A GPU cannot raise without a sync: a bad token routes every slot, a bad table entry its
    slot, to expert 0 with a NaN weight (all the token's with renormalize), the other tokens
    exactly as with a good table. An int64 whose low word is in range is still out of range."""
    logits, _ = make_logits(6, n, device="cuda")
    table = make_table(n, 4, vocab=8, dtype=dtype, device="cuda")
    big = 2**32 + 1 if dtype == torch.int64 else 2**31 - 1
    table[3, 2] = n
    table[4, 1] = -5
    table[5, 3] = big
    input_ids = torch.tensor([0, 8, -1, 3, 4, 5], dtype=dtype, device="cuda")
    if dtype == torch.int64:
        input_ids[0] = 2**32  # low word 0
    for renormalize in (True, False):
        weights, ids = kimi_router_ops.moe_routing(logits, None, 4, renormalize=renormalize, scoring="sqrtsoftplus",
                                                   input_ids=input_ids, hash_table=table)
        weights, ids = weights.cpu(), ids.cpu()
        bad_tokens = [1, 2] + ([0] if dtype == torch.int64 else [])
        for m in bad_tokens:
            assert weights[m].isnan().all() and (ids[m] == 0).all()
        for m, slot in ((3, 2), (4, 1), (5, 3)):
            assert ids[m, slot] == 0 and weights[m, slot].isnan()
            assert weights[m].isnan().all() == renormalize
            good = [s for s in range(4) if s != slot]
            assert torch.equal(ids[m, good], table[m, good].int().cpu())
        if dtype == torch.int32:  # token 0 is good
            ref_w, ref_ids = hash_formula(logits[:1], input_ids[:1], table, renormalize, 1.0, "sqrtsoftplus")
            assert torch.equal(ids[:1].long(), ref_ids)
            torch.testing.assert_close(weights[:1].double(), ref_w, rtol=1e-5, atol=1e-12)
    torch.cuda.synchronize()  # the context is fine


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    logits, bias = make_logits(5, 64, device=device)
    table = make_table(64, 4, vocab=10, device=device)
    input_ids = make_ids(5, vocab=10, dtype=torch.int32, device=device)
    torch.library.opcheck(torch.ops.kimi.moe_routing.default,
                          (logits, bias, 4, 1, 1, True, 2.0, "sqrtsoftplus", input_ids, table))
    x, w, bias = make_case(5, 64, 96, 4, 1, 1, device=device)
    torch.library.opcheck(torch.ops.kimi.router.default,
                          (x, w, bias, 4, 1, 1, True, 2.0, "sqrtsoftplus", None, input_ids, table))


@pytest.mark.parametrize("device", DEVICES)
def test_compile_fullgraph_dynamic_parity(device):
    torch._dynamo.reset()
    _, w, bias = make_case(1, 256, 512, 6, 1, 1, device=device)
    table = make_table(256, 6, device=device)

    def route(x, input_ids):
        return kimi_router_ops.router(x, w, bias, 6, routed_scaling_factor=1.5, scoring="sqrtsoftplus",
                                      input_ids=input_ids, hash_table=table)

    compiled = torch.compile(route, fullgraph=True, dynamic=True)
    for m in (1, 3, 8, 5):
        x, _, _ = make_case(m, 256, 512, 6, 1, 1, device=device, seed=m)
        input_ids = make_ids(m, device=device, seed=m)
        for a, b in zip(compiled(x, input_ids), route(x, input_ids)):
            assert torch.equal(a, b)


@requires_kernel_gpu
def test_cuda_graph_capture_and_replay_with_new_tokens():
    x, w, bias = make_case(4, 384, 7168, 6, 1, 1, device="cuda")
    table = make_table(384, 6, device="cuda")
    input_ids = make_ids(4, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=torch.cuda.Stream()):
        out = kimi_router_ops.router(x, w, bias, 6, routed_scaling_factor=2.5, scoring="sqrtsoftplus",
                                     input_ids=input_ids, hash_table=table)
    for seed in range(3):
        input_ids.copy_(make_ids(4, device="cuda", seed=seed + 7))
        x.copy_(make_case(4, 384, 7168, 6, 1, 1, device="cuda", seed=seed + 1)[0])
        graph.replay()
        torch.cuda.synchronize()
        assert_hash_routed(out, out[2], input_ids, table, True, 2.5)


@st.composite
def hash_problems(draw):
    n = draw(st.sampled_from([8, 32, 64, 100, 256, 384, 1024]))
    top_k = draw(st.integers(1, min(n, 32)))
    return dict(m=draw(st.integers(1, 40)), n=n, top_k=top_k, vocab=draw(st.integers(1, 50)),
                scoring=draw(st.sampled_from(SCORINGS)), seed=draw(st.integers(0, 2**16)),
                ids_dtype=draw(st.sampled_from(INDEX_DTYPES)), table_dtype=draw(st.sampled_from(INDEX_DTYPES)))


def _property(problem, renormalize, device):
    p = problem
    logits, bias = make_logits(p["m"], p["n"], device=device, seed=p["seed"])
    table = make_table(p["n"], p["top_k"], vocab=p["vocab"], dtype=p["table_dtype"], device=device, seed=p["seed"])
    input_ids = make_ids(p["m"], vocab=p["vocab"], dtype=p["ids_dtype"], device=device, seed=p["seed"])
    out = kimi_router_ops.moe_routing(logits, bias, p["top_k"], renormalize=renormalize, routed_scaling_factor=2.0,
                                      scoring=p["scoring"], input_ids=input_ids, hash_table=table)
    assert_hash_routed(out, logits, input_ids, table, renormalize, 2.0, p["scoring"])


@settings(max_examples=60, deadline=None)
@given(problem=hash_problems(), renormalize=st.booleans())
def test_property_cpu(problem, renormalize):
    _property(problem, renormalize, "cpu")


@requires_kernel_gpu
@settings(max_examples=60, deadline=None)
@given(problem=hash_problems(), renormalize=st.booleans())
def test_property_cuda(problem, renormalize):
    _property(problem, renormalize, "cuda")
