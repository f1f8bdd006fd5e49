"""The kernel choice (made in C++, callable without a GPU) and the ahead-of-time build."""

import re
from pathlib import Path

import pytest

import kimi_router_ops
from kimi_router_ops import tables
from kimi_router_ops.aot import LAB_ENV, compiled_kernels, lab_build
from conftest import CUDA_BUILD, MODEL_SHAPES, requires_cuda_build

# (setup.py's directory: build/aot_lab for a build with the lab rows.)
AOT_DIR = Path(__file__).resolve().parent.parent / "build" / ("aot_lab" if lab_build() else "aot")
# The tests below inspect this checkout's ahead-of-time build (objects, PTX); a run against
# an installed wheel has none.
requires_aot_build = pytest.mark.skipif(
    not (CUDA_BUILD and (AOT_DIR / "kimi_kernels.h").exists()),
    reason="needs build/aot, this checkout's ahead-of-time build (testing an installed wheel?)",
)


def row(name):
    return tables.gemm.variant(name)


def choice(m, n, k):
    """The dispatch rule for an aligned problem, restated from CHOICES: the C++ choice is
    held to it."""
    return next((c.variant for c in tables.gemm.CHOICES if c.weight_dtype == "bfloat16"
                 and c.m_lo <= m <= c.m_hi and c.n_min <= n <= c.n_max and c.k_min <= k <= c.k_max), "cublas")


@pytest.mark.parametrize("sm", [90, 100])
@pytest.mark.parametrize("n, k", MODEL_SHAPES.values())
def test_m1_picks_a_prefetch_kernel(sm, n, k):
    name, vec = kimi_router_ops.chosen_variant(1, n, k, sm=sm).split(":")
    assert row(name).prefetch and row(name).pdl and vec == "vec8"


@pytest.mark.parametrize("n, k", list(MODEL_SHAPES.values()) + [(64, 2048), (1024, 2048), (512, 8192), (1000, 4096)])
@pytest.mark.parametrize("m", list(range(1, 129)) + [200, 256, 257, 4096])
def test_every_m_gets_the_first_choice_that_takes_it(m, n, k):
    chosen = kimi_router_ops.chosen_variant(m, n, k)
    expected = choice(m, n, k)
    if expected == "cublas":
        assert chosen == "cublas"
        return
    name, vec = chosen.split(":")
    assert (name, vec) == (expected, "vec8")
    assert m <= row(name).max_m  # the kernel computes that many tokens


def test_choices_of_a_compiled_in_k_take_that_k_only():
    for table in (tables.gemm.CHOICES, tables.gemm.BATCH_INVARIANT_CHOICES):
        for c in table:
            k_only = getattr(row(c.variant).kernel, "k", 0) if c.variant != "cublas" else 0
            assert k_only in (0, c.k_min) and (not k_only or c.k_max == k_only), c


def test_choices_name_compiled_rows_and_cover_every_m_up_to_16():
    names = {v.name for v in tables.gemm.VARIANTS}  # product rows: no choice runs an experiment
    assert all(c.variant in names | {"cublas"} for c in tables.gemm.CHOICES)
    for n in (1, 64, 256, 384, 385, 896, 897, 1024, 100000):
        for k in (8, 2048, 7168, 8192, 8200):
            for m in range(1, 17):
                chosen = choice(m, n, k)
                assert chosen != "cublas" or n > 896, (m, n, k)  # cuBLAS at M <= 16: N > 896 only


@pytest.mark.parametrize(
    "m, n, k, sm, aligned, expected",
    [
        (0, 896, 7168, 90, True, "empty"),
        (1, 896, 7168, 90, True, "m1_prefetch_r1_t128_k7168:vec8"),  # K compiled in
        (1, 256, 7168, 100, True, "m1_prefetch_r1_t256_k7168_at_exit:vec8"),
        (1, 384, 7168, 90, True, "m1_prefetch_r1_t256_k7168_at_exit:vec8"),
        (1, 1024, 7168, 90, True, "m1_prefetch_r4_t256:vec8"),  # more than one wave of r1
        (1, 896, 4096, 90, True, "m1_prefetch_r4_t256:vec8"),  # K at run time
        (2, 896, 7168, 90, True, "mma8_t2c4w8u7:vec8"),  # Kimi-K3: the tensor cores
        (2, 384, 7168, 90, True, "m2_prefetch_r1_t128_k7168:vec8"),  # 129..384: K compiled in
        (2, 129, 7168, 100, True, "m2_prefetch_r1_t128_k7168:vec8"),
        (2, 128, 7168, 90, True, "mma8_t1c4w8u7:vec8"),
        (2, 256, 4096, 90, True, "mma8_t2c4w8u7:vec8"),  # K at run time
        (2, 256, 7168, 90, False, "m2:vec1"),
        (8, 256, 7168, 100, True, "mma8_t2c4w8u7:vec8"),
        (9, 896, 7168, 90, True, "mma16_t2c4w8u7_before_wait:vec8"),
        (16, 384, 7168, 90, True, "mma16_t2c4w8u7:vec8"),
        (16, 385, 7168, 90, True, "mma16_t2c4w8u7_before_wait:vec8"),
        (16, 256, 7168, 100, True, "mma16_t2c4w8u7:vec8"),
        (17, 896, 7168, 90, True, "mma32p16_t2c4w8u7_before_wait:vec8"),
        (33, 896, 7168, 90, True, "cublas"),
        (48, 256, 7168, 100, True, "mma16_t2c4w8u7_before_wait:vec8"),
        (64, 256, 7168, 90, True, "mma32p16_t2c4w8u7_before_wait:vec8"),
        (40, 384, 7168, 90, True, "mma32p16_t2c4w8u7_before_wait:vec8"),
        (96, 384, 7168, 90, True, "cublas"),
        (256, 384, 7168, 90, True, "cublas"),
        (2, 64, 2048, 90, True, "mma8_t1c4w8u7:vec8"),  # N <= 128
        (2, 1024, 2048, 90, True, "m2:vec8"),  # N > 896 at small K: the dot product
        (8, 1024, 2048, 90, True, "m8:vec8"),
        (8, 1024, 4096, 90, True, "mma8_t2c4w8u7:vec8"),
        (16, 1024, 7168, 90, True, "cublas"),
        (4, 256, 8192, 90, True, "mma8_t2c4w8u8:vec8"),  # K up to 8192 in one step
        (12, 256, 8192, 90, True, "mma16_t1c8w8u4:vec8"),
        (12, 512, 8192, 90, True, "mma16_t2c4w8u7_before_wait:vec8"),
        (4096, 896, 7168, 90, True, "cublas"),
        (17, 896, 7168, 90, False, "cublas"),
        (1, 896, 7168, 80, True, "cublas"),  # Ampere: no kernels
        (1, 896, 7168, 120, True, "cublas"),  # consumer Blackwell: no kernels
        (1, 896, 7169, 90, True, "m1_prefetch_r4_t256:vec1"),  # K % 8 != 0
        (1, 896, 7168, 90, False, "m1_prefetch_r4_t256:vec1"),  # misaligned pointer or stride
        (2, 896, 7168, 90, False, "m2:vec1"),  # tensor cores need 16-byte loads
        (3, 1, 1, 100, True, "m4:vec1"),
        (5, 896, 7169, 90, True, "cublas"),
    ],
)
def test_choice(m, n, k, sm, aligned, expected):
    assert kimi_router_ops.chosen_variant(m, n, k, sm=sm, aligned=aligned) == expected


def test_choice_does_not_depend_on_out_dtype():
    import torch

    for m in (1, 5, 16, 40):
        assert kimi_router_ops.chosen_variant(m, 384, 7168, torch.bfloat16) == kimi_router_ops.chosen_variant(m, 384, 7168)


def symbols(family=""):
    return [k.symbol for k in compiled_kernels(family)]


@pytest.mark.parametrize("lab", [False, True])
def test_lab_rows_are_compiled_only_when_asked(monkeypatch, lab):
    """A wheel's build compiles the product rows; KIMI_ROUTER_OPS_LAB=1 adds the lab rows."""
    monkeypatch.setenv(LAB_ENV, "1" if lab else "0")
    rows = {k.row for k in compiled_kernels("Gemm")}
    assert rows == set(tables.gemm.ALL_VARIANTS if lab else tables.gemm.VARIANTS)


@requires_cuda_build
def test_every_variant_is_linked_for_every_arch(monkeypatch):
    """_C links exactly the kernels of a build with or without the lab rows."""
    linked = kimi_router_ops.compiled_kernels()
    lab = any(s.startswith(f"kimi_{tables.gemm.LAB_VARIANTS[0].name}_v") for s in linked)
    monkeypatch.setenv(LAB_ENV, "1" if lab else "0")
    assert linked == symbols()
    archs = {arch for arch, _ in tables.ARCHS}
    assert archs == {"sm_90a", "sm_100a"}
    rows = tables.gemm.ALL_VARIANTS if lab else tables.gemm.VARIANTS
    assert len(symbols("Gemm")) == (sum(len(v.kernel.vecs) * len(v.x_dtypes) for v in rows)
                                    * len(tables.OUT_DTYPES) * len(archs))
    assert len(symbols("Router")) == len(tables.router.ROUTER_VARIANTS) * len(tables.BIAS_DTYPES) * len(archs)
    assert len(symbols("Routing")) == (len(tables.ROUTER_N_RANGES) * len(tables.OUT_DTYPES)
                                       * len(tables.BIAS_DTYPES) * len(archs))
    assert len(set(symbols())) == len(symbols())


def test_router_rows_fuse_existing_gemm_rows():
    names = {v.name for v in tables.gemm.VARIANTS}  # product rows
    for r in tables.router.ROUTER_VARIANTS:
        assert r.gemm in names
        assert r.m_hi <= tables.gemm.variant(r.gemm).max_m  # the GEMM kernel computes M tokens
        assert r.n_max <= 1024  # a warp routes at most 32 experts per lane


def test_at_publisher_rows_route_every_token_they_serve():
    """An at_publisher row routes token m in rank m // t of the last cluster, by its warp
    m % t (t tokens finished a rank): the cluster's ranks must cover every M the row serves,
    and a rank must have t warps."""
    pytest.importorskip("cutlass", reason="the kernel objects need nvidia-cutlass-dsl")
    from kimi_router_ops import aot

    rows = [r for r in tables.router.ROUTER_VARIANTS if r.at_publisher]
    assert rows
    for r in rows:
        router = aot.router_object(r)
        assert router.tokens_per_rank * router.gemm.cluster_k >= r.m_hi, r.name
        assert router.tokens_per_rank <= router.warps, r.name


@requires_aot_build
def test_aot_objects_present():
    for symbol, arch in [(k.symbol, k.arch) for k in compiled_kernels()]:
        for suffix in (".o", ".h", ".ptx"):
            assert (AOT_DIR / arch / f"{symbol}{suffix}").stat().st_size > 0, f"{arch}/{symbol}{suffix}"
    assert (AOT_DIR / "kimi_kernels.h").exists()


def ptx_body(symbol, arch):
    return (AOT_DIR / arch / f"{symbol}.ptx").read_text()


def global_loads_before(ptx, mark="griddepcontrol.wait"):
    """Global loads that precede `mark` (by default the PDL wait) in program order."""
    head, sep, _ = ptx.partition(mark)
    assert sep, f"no {mark}"
    return re.findall(r"ld\.global[.\w]*\s", head)


@requires_aot_build
@pytest.mark.parametrize("arch", [a for a, _ in tables.ARCHS])
def test_ptx_only_prefetch_variants_load_before_the_pdl_wait(arch):
    checked = 0
    for k in compiled_kernels("Gemm", arch):
        v, vec = k.row, k.vec
        ptx = ptx_body(k.symbol, arch)
        if not v.pdl:
            assert "griddepcontrol" not in ptx
            continue
        before_wait, _, after_wait = ptx.partition("griddepcontrol.wait")
        signal = after_wait if v.trigger in ("after_x", "at_exit") else before_wait
        assert "griddepcontrol.launch_dependents" in signal, v.name
        if v.trigger == "at_exit":  # after the last store
            assert "st.global" not in after_wait.partition("griddepcontrol.launch_dependents")[2], v.name
        loads = global_loads_before(ptx)
        if v.prefetch:
            # Exactly the first step of weight loads (one per vector), 16 bytes wide at vec 8.
            assert len(loads) == v.kernel.prefetch_loads(), loads
            if vec == v.kernel.vecs[0] and vec > 1:  # 16-byte loads (fp32 pairs on sm_100a)
                assert all(".v4." in load or ".v2.b64" in load for load in loads), loads
        else:
            assert loads == []
        checked += 1
    assert checked >= 4


@requires_aot_build
def test_ptx_prefetch_loads_read_the_weight_pointer():
    """The loads before the wait address router_weight (kernel parameter 1), never x."""
    k = next(k for k in compiled_kernels("Gemm", "sm_90a") if k.row.prefetch and k.vec == 8)
    ptx = ptx_body(k.symbol, "sm_90a")
    head = ptx.partition("griddepcontrol.wait")[0]
    params = dict(re.findall(r"ld\.param\.b64\s+(%rd\d+), \[\w+_param_(\d)\];", head))
    assert params, "no pointer parameters found"
    assert "0" in params.values() and "1" in params.values()
    weight_base = next(reg for reg, p in params.items() if p == "1")
    x_base = next(reg for reg, p in params.items() if p == "0")
    adds = re.findall(r"add\.s64\s+(%rd\d+), (%rd\d+), %rd\d+;", head)
    load_addrs = re.findall(r"ld\.global[.\w]*\s+\{[^}]*\}, \[(%rd\d+)\];", head)
    bases = {dst: base for dst, base in adds}
    assert load_addrs and all(bases.get(a) == weight_base for a in load_addrs)
    assert all(bases.get(a) != x_base for a in load_addrs)


@requires_aot_build
@pytest.mark.parametrize("arch", [a for a, _ in tables.ARCHS])
def test_ptx_norm_kernels_signal_at_entry_and_read_only_their_weight_before_the_wait(arch):
    """The norm lets a router behind it launch at once, and before its grid-dependency wait
    it reads nothing an earlier kernel writes: only one step of the norm weight (param 2).
    (Signalling after its first loads of x instead measured 0.5-0.9 us slower a pair:
    docs/kernel-notes.md.)"""
    for k in compiled_kernels("Norm", arch):
        norm = k.row
        ptx = ptx_body(k.symbol, arch)
        head = ptx.partition("griddepcontrol.wait")[0]
        assert "griddepcontrol.launch_dependents" in head
        assert len(global_loads_before(ptx)) == norm.unroll
        params = dict(re.findall(r"ld\.param\.b64\s+(%rd\d+), \[\w+_param_(\d)\];", head))
        assert "2" in params.values(), params
        loaded = re.findall(r"ld\.global[.\w]*\s+(?:\{[^}]*\}|%[\w]+), \[(%rd\d+)\];", head)
        bases = dict(re.findall(r"add\.s64\s+(%rd\d+), (%rd\d+), %rd\d+;", head))
        weight = next(reg for reg, p in params.items() if p == "2")
        assert loaded and all(a == weight or bases.get(a) == weight for a in loaded), (loaded, bases)


def mma_kernels(arch="sm_90a"):
    return [(k.row, k.symbol) for k in compiled_kernels("Gemm", arch) if isinstance(k.row.kernel, tables.gemm.Mma)]


@requires_aot_build
def test_ptx_cluster_protocol_of_the_tensor_core_kernels():
    """A peer's shared memory is written only after every CTA of the cluster has arrived at
    the entry barrier, and read back only after the barrier that releases those writes."""
    checked = 0
    for v, symbol in mma_kernels():
        ptx = ptx_body(symbol, "sm_90a")
        if v.kernel.cluster_k == 1:
            assert "barrier.cluster" not in ptx and "st.shared::cluster" not in ptx
            continue
        events = re.findall(r"barrier\.cluster\.arrive(?:\.relaxed)?|barrier\.cluster\.wait|"
                            r"st\.shared::cluster|ld\.shared\.", ptx)
        first_store = events.index("st.shared::cluster")
        assert events[:2] == ["barrier.cluster.arrive.relaxed", "barrier.cluster.wait"], events[:4]
        assert first_store == 2
        last_store = len(events) - 1 - events[::-1].index("st.shared::cluster")
        assert events[last_store + 1:last_store + 3] == ["barrier.cluster.arrive", "barrier.cluster.wait"]
        assert "ld.shared." in events[last_store + 3:]
        assert events.count("barrier.cluster.wait") == 2
        checked += 1
    assert checked >= 3


@requires_aot_build
def test_ptx_first_step_loads_all_issue_before_the_first_mma():
    """Every load of the first step (weights and tokens) precedes the first MMA, so the
    whole step is in flight at once; launch_dependents comes after all of them, or, in the
    "before_wait" rows, after the weight loads alone ("at_entry": before any)."""
    for v, symbol in mma_kernels():
        ptx = ptx_body(symbol, "sm_90a")
        weights = 2 * v.kernel.tiles * v.kernel.unroll
        tokens = ((v.kernel.pass_tokens or v.kernel.tokens) // 8) * v.kernel.unroll  # the first pass
        signal_after = {"at_entry": 0, "before_wait": weights, "after_x": weights + tokens}[v.trigger]
        for mark, loads in (("mma.sync", weights + tokens), ("griddepcontrol.launch_dependents", signal_after)):
            head = ptx.partition(mark)[0]
            assert len(re.findall(r"ld\.global\.v4", head)) == loads, (v.name, mark)


@requires_aot_build
@pytest.mark.parametrize("arch", [a for a, _ in tables.ARCHS])
def test_ptx_fused_router_signals_the_next_kernel_where_its_row_says(arch):
    """launch_dependents once: at kernel entry (before any global load), after the weight
    prefetch and before the PDL wait, after the wait and the first step's loads, or after the
    GEMM's stores and before the routing's polls."""
    for k in compiled_kernels("Router", arch):
        r = k.row
        ptx = ptx_body(k.symbol, arch)
        assert ptx.count("griddepcontrol.launch_dependents") == 1, r.name
        head = ptx.partition("griddepcontrol.launch_dependents")[0]
        gemm = tables.gemm.variant(r.gemm)
        prefetched = gemm.kernel.prefetch_loads() if gemm.prefetch else 0
        if r.trigger == "after_x":
            assert "griddepcontrol.wait" in head, r.name
        elif r.trigger == "at_exit":
            assert "st.relaxed.gpu" in head and "ld.relaxed.gpu" not in head, r.name
        else:
            assert "griddepcontrol.wait" not in head, r.name
            loads = global_loads_before(ptx, "griddepcontrol.launch_dependents")
            assert len(loads) == (0 if r.trigger == "at_entry" else prefetched), r.name


@requires_aot_build
@pytest.mark.parametrize("arch", [a for a, _ in tables.ARCHS])
def test_ptx_fused_router_hands_off_through_the_buffer(arch):
    """In every fused router kernel: each logit's score is published with one relaxed
    gpu-scope store and polled with relaxed gpu-scope loads (they bypass L1), all after the PDL wait,
    which is what makes the previous call's emptying visible; the routing (redux) reads
    polled values only. No fences, and no atomics but the expert counts' add after the
    routing (kernels/routing.py): a word is its own ready flag."""
    for k in compiled_kernels("Router", arch):
        r = k.row
        ptx = ptx_body(k.symbol, arch)
        slots = -(-r.n_max // 32)
        wait = ptx.index("griddepcontrol.wait")
        assert ptx.count("st.relaxed.gpu.global.b32") == 1, r.name
        # First look and re-poll, in the all-experts path and the clamped one.
        assert ptx.count("ld.relaxed.gpu.global.b32") == 2 * 2 * slots, r.name
        assert wait < ptx.index("st.relaxed.gpu") < ptx.index("ld.relaxed.gpu"), r.name
        assert ptx.index("ld.relaxed.gpu") < ptx.index("redux.sync"), r.name
        assert not re.search(r"\bfence\.|membar", ptx), r.name
        assert re.findall(r"\batom\.[\w.]+", ptx) == ["atom.global.add.u32"], r.name
        assert ptx.index("redux.sync") < ptx.index("atom.global.add.u32"), r.name


@requires_aot_build
@pytest.mark.parametrize("arch", [a for a, _ in tables.ARCHS])
def test_ptx_fused_router_prefetches_only_the_bias_before_the_wait(arch):
    """A row with the bias prefetch asks L2 for the bias (kernel parameter 3, after the gate
    bias; rounded up to
    16 bytes) before the PDL wait with one bulk prefetch, and loads nothing but the
    weights' first step there; without it, no prefetch at all."""
    for k in compiled_kernels("Router", arch):
        r = k.row
        ptx = ptx_body(k.symbol, arch)
        head = ptx.partition("griddepcontrol.wait")[0]
        assert ptx.count("prefetch") == head.count("cp.async.bulk.prefetch.L2.global [") == int(r.bias_prefetch)
        gemm = tables.gemm.variant(r.gemm)
        assert len(global_loads_before(ptx)) == (gemm.kernel.prefetch_loads() if gemm.prefetch else 0)
        if r.bias_prefetch:
            params = dict(re.findall(r"ld\.param\.b64\s+(%rd\d+), \[\w+_param_(\d)\];", head))
            bias = next(reg for reg, p in params.items() if p == "3")
            addr = re.search(r"cp\.async\.bulk\.prefetch\.L2\.global \[(%rd\d+)\]", head).group(1)
            rounded = re.search(rf"and\.b64\s+{addr}, (%rd\d+), -16;", head).group(1)
            assert re.search(rf"add\.s64\s+{rounded}, {bias}, 15;", head), r.name


@requires_aot_build
@pytest.mark.parametrize("arch", [a for a, _ in tables.ARCHS])
def test_ptx_attn_res_signals_at_entry_and_reads_only_its_weights_before_the_wait(arch):
    """The router behind AttnRes may launch at once; before the wait AttnRes reads its three
    weight vectors alone, after it every source at once (16-byte loads)."""
    ptx = ptx_body(compiled_kernels("AttnRes", arch)[0].symbol, arch)
    assert ptx.count("griddepcontrol.launch_dependents") == 1
    assert global_loads_before(ptx, "griddepcontrol.launch_dependents") == []
    assert len(global_loads_before(ptx)) == 3
    body = ptx.partition("griddepcontrol.wait")[2]
    assert len(re.findall(r"ld\.global\.v4", body)) == 2 + tables.attn_res.ATTN_RES_KERNEL.max_blocks
