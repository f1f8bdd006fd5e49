"""The rivals' kernels for the benchmarks, loaded beside ours when they are built (never
part of the package: their sources are fetched into the ignored build/peers, see
../shared/peers/README.md and tools/get_vllm_dsv4_topk.sh). Each loader returns a callable,
or None with the reason printed: a benchmark skips a peer that is absent or does not load
here."""

import importlib.util
import json
import os
import sys
import types
from pathlib import Path

import torch

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


def vllm_dsv4_topk():
    """vLLM 0.33's DeepSeek-V4 router after the logits (its Triton `dsv4_topk`: sqrt(softplus),
    the bias for the choice, top-6, renormalized, scaled; 256 or 384 experts), as
    fn(logits, bias, routed_scaling_factor) -> (weights, ids int32), or None."""
    path = PEERS_DIR / "third_party" / "vllm_dsv4" / "dsv4_topk.py"
    if not path.exists():
        return _skipped("vLLM's dsv4_topk", f"run tools/get_vllm_dsv4_topk.sh (into {path.parent})")
    try:
        import triton
        import triton.language as tl
    except ImportError as error:
        return _skipped("vLLM's dsv4_topk", error)
    # The two vLLM modules the file imports, as vLLM 0.33 answers on an H200: CUDA, with PDL.
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(is_cuda=lambda: True, is_arch_support_pdl=lambda: True)
    triton_utils = types.ModuleType("vllm.triton_utils")
    triton_utils.tl, triton_utils.triton = tl, triton
    names = ("vllm", "vllm.platforms", "vllm.triton_utils")
    saved = {name: sys.modules.get(name) for name in names}
    sys.modules.update({"vllm": types.ModuleType("vllm"), "vllm.platforms": platforms,
                        "vllm.triton_utils": triton_utils})
    try:
        spec = importlib.util.spec_from_file_location("vllm_dsv4_topk_peer", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception as error:
        return _skipped("vLLM's dsv4_topk", error)
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old
    return lambda logits, bias, scale: module.dsv4_topk(logits, bias, torch.int32, scale)
