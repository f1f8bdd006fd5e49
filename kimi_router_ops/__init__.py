"""kimi_router_ops: the low-latency MoE router GEMM as a PyTorch op.

    logits = kimi_router_ops.ll_bf16_gemm(hidden_states, router_weight)  # fp32 [M, N]
    logits = kimi_router_ops.router_gemm(hidden_states, fp32_or_bf16_weight, bias)
    weights, ids, logits = kimi_router_ops.ll_bf16_router(hidden_states, router_weight, bias, top_k)
    weights, ids = kimi_router_ops.moe_routing(logits, bias, top_k)       # routing alone
    kimi_router_ops.router_out(x, w, bias, top_k, topk_weights=tw, topk_ids=ti, logits=lg)  # into yours
    weights, ids, logits, proj = kimi_router_ops.router_and_projection(x, w, p, bias, top_k)

Importing the package loads `_C`, which registers torch.ops.kimi.*; run time needs only torch.
"""

import os as _os
from pathlib import Path as _Path

import torch as _torch

try:  # the installed distribution's (pyproject.toml)
    from importlib.metadata import version as _version

    __version__ = _version("kimi_router_ops")
except Exception:  # run from a source tree that was never installed
    __version__ = "unknown"

# The build (setup.py: python -m kimi_router_ops.aot) reads the kernel tables from this
# package before _C exists; it says so with KIMI_ROUTER_OPS_BUILD=1.
if _os.environ.get("KIMI_ROUTER_OPS_BUILD") != "1":
    # _C is a plain shared library on torch's stable ABI (not a Python module): loading it
    # runs the registrations of the ops' schemas and kernels.
    _torch.ops.load_library(_Path(__file__).with_name("_C.abi3.so"))

    from . import ops
    from .ops import *  # noqa: F401,F403  (every op's wrapper: ops.OPS)
    from .router_linear import RouterLinear

    __all__ = ["RouterLinear", "__version__", *ops.__all__]
else:
    __all__ = ["__version__"]

del _os, _Path, _torch, _version


def __getattr__(name):
    """`kimi_router_ops.integrations` on first use: importing the package imports no
    integration (nor transformers, vLLM or SGLang)."""
    if name == "integrations":
        import importlib

        return importlib.import_module(".integrations", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

