"""The rivals' kernels for the benchmarks, loaded beside ours when they are built (never
part of the package: their sources are fetched into the ignored build/peers, see
../shared/peers/README.md, tools/get_vllm_peers.sh and tools/build_vllm_skinny.py). Each
loader returns a callable, or None with the reason printed: a benchmark skips a peer that is
absent or does not load here."""

import importlib.util
import json
import os
import sys
import types
from pathlib import Path

import torch
import torch.nn.functional as F

PEERS_DIR = Path(os.environ.get("PEERS_DIR", "build/peers")).resolve()
PEERS_SRC = Path(os.environ.get("PEERS_SRC", "../shared/peers")).resolve()


def _skipped(what, why):
    print(f"{what} skipped: {why}".splitlines()[0])
    return None


def vllm_serves(m, n, k):
    """Whether the vLLM peer has a kernel for this (M, N, K): its build's manifest lists them
    (../shared/peers/vllm_ll: K = 7168 with N 896 / 384 / 256, K = 4096 with N 256; M 1, 2,
    3, 4, 8, 16). vLLM itself compiles every M <= 16 and then falls back to cuBLAS."""
    manifest = PEERS_DIR / "vllm_ll_aot" / "manifest.json"
    if not manifest.exists():
        return False
    cases = json.loads(manifest.read_text())["cases"]
    return any((c["M"], c["N"], c["K"]) == (m, n, k) for c in cases)


def vllm_gate():
    """vLLM 0.33's `ll_bf16` router GEMM as shipped (the M == 1 prefetch kernel at M = 1, its
    default kernels above; K = 7168, N in 896 / 384 / 256), or None."""
    shared = PEERS_SRC / "vllm_ll"
    if not (PEERS_DIR / "vllm_ll_aot").exists() or not shared.exists():
        return _skipped("vLLM's ll_bf16", f"build {shared} into {PEERS_DIR} (its README)")
    try:
        sys.path.insert(0, str(shared))
        import build_ext

        build_ext.load()
    except Exception as error:  # a peer that does not build here is skipped, not fatal
        return _skipped("vLLM's ll_bf16", error)
    return lambda x, w: torch.ops.vllm_ll.gemm(x, w, 1 if x.shape[0] == 1 else 0)


def _vllm_triton_module(what, path, platform):
    """Execute one of vLLM's Triton files (tools/get_vllm_peers.sh copies them) with the few
    vLLM modules it imports standing in: `vllm.platforms.current_platform` as `platform`
    (what vLLM 0.33 answers on an H200), `vllm.triton_utils`, an empty `vllm._custom_ops`."""
    if not path.exists():
        return _skipped(what, f"run tools/get_vllm_peers.sh (into {path.parent})")
    try:
        import triton
        import triton.language as tl
    except ImportError as error:
        return _skipped(what, error)
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = platform
    triton_utils = types.ModuleType("vllm.triton_utils")
    triton_utils.tl, triton_utils.triton = tl, triton
    stand_ins = {"vllm": types.ModuleType("vllm"), "vllm.platforms": platforms,
                 "vllm.triton_utils": triton_utils, "vllm._custom_ops": types.ModuleType("vllm._custom_ops")}
    saved = {name: sys.modules.get(name) for name in stand_ins}
    sys.modules.update(stand_ins)
    try:
        spec = importlib.util.spec_from_file_location(f"{path.stem}_vllm_peer", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as error:
        return _skipped(what, error)
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    return module


H200 = types.SimpleNamespace(is_cuda=lambda: True, is_arch_support_pdl=lambda: True,
                             is_device_capability_family=lambda capability: capability == 90)


def vllm_dsv4_topk():
    """vLLM 0.33's DeepSeek-V4 router after the logits (its Triton `dsv4_topk`: sqrt(softplus),
    the bias for the choice, top-6, renormalized, scaled; 256 or 384 experts), as
    fn(logits, bias, routed_scaling_factor) -> (weights, ids int32), or None."""
    module = _vllm_triton_module("vLLM's dsv4_topk", PEERS_DIR / "third_party" / "vllm_dsv4" / "dsv4_topk.py", H200)
    return module and (lambda logits, bias, scale: module.dsv4_topk(logits, bias, torch.int32, scale))


def vllm_attn_res():
    """vLLM 0.33's Kimi-K3 AttnRes as it runs on Hopper (its Triton kernel, launched with PDL;
    the native kernel is SM100-only), with `kimi_router_ops.attn_res`'s arguments, or None."""
    module = _vllm_triton_module("vLLM's attn_res", PEERS_DIR / "third_party" / "vllm_k3" / "attn_res.py", H200)
    return module and module.attn_res


def vllm_down_projection():
    """Kimi-K3's down-projection (N 3584, K 7168) as vLLM 0.33 runs it on SM90: its CuTe-DSL
    skinny GEMM at the token counts of its table (M = 1..3, tools/build_vllm_skinny.py), cuBLAS
    above; as fn(x, p) -> bf16, or None when the skinny GEMM is not built."""
    aot, source = PEERS_DIR / "vllm_skinny_aot", Path(__file__).resolve().parents[2] / "tools" / "vllm_skinny.cpp"
    if not (aot / "manifest.json").exists() or not source.exists():
        return _skipped("vLLM's skinny GEMM", f"run tools/build_vllm_skinny.py (into {aot})")
    try:
        from torch.utils import cpp_extension

        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0a")  # a C++ file: no device code to target
        kernels = json.loads((aot / "manifest.json").read_text())["kernels"]
        objects = [str(aot / f"{k['symbol']}.o") for k in kernels]
        cpp_extension.load(name="vllm_skinny_ops", sources=[str(source)], extra_include_paths=[str(aot)],
                           extra_cflags=["-O2"], extra_ldflags=objects + [str(aot / "libcuda_dialect_runtime_static.a"),
                                                                      "-lcudart"],
                           with_cuda=True, is_python_module=False)
    except Exception as error:
        return _skipped("vLLM's skinny GEMM", error)
    served = {k["M"] for k in kernels}
    return lambda x, p: torch.ops.vllm_skinny.gemm(x, p) if x.shape[0] in served else F.linear(x, p)
