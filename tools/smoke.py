"""Smallest GPU call of the op, for debugging a build on a new machine."""
import faulthandler

import torch

import kimi_router_ops

faulthandler.enable()
x = torch.randn(1, 7168, device="cuda").bfloat16()
w = torch.randn(896, 7168, device="cuda").bfloat16()
print("choice", kimi_router_ops.chosen_variant(1, 896, 7168), flush=True)
out = kimi_router_ops.ll_bf16_gemm(x, w)
torch.cuda.synchronize()
ref = x.double() @ w.double().t()
print("rel err", ((out.double() - ref).norm() / ref.norm()).item())
try:  # an error whose message formats integers, raised from the CUDA path
    kimi_router_ops.router_gemm_with_variant(torch.cat([x, x]), w, "m1_r4_t256")
except RuntimeError as e:  # every argument error is a RuntimeError (docs/api.md)
    print("error ok:", e)
