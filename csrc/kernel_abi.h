#pragma once
// The C interface of the kernels exported by kimi_router_ops/aot.py (CuTe DSL export_to_c).

#include <torch/headeronly/core/ScalarType.h>  // the header-only dtype enum
#include <cuda_runtime.h>
#include <cstdint>

namespace kimi {

// Layout of every exported tensor argument: a rank-2 tensor whose two sizes and outer
// stride are run-time values (the inner stride is 1 by construction).
struct TensorArg {
  void* data;
  int32_t shapes[2];
  int64_t strides[1];
};

// A rank-3 tensor argument (AttnRes's blocks [M, R, H]): three sizes, two outer strides.
struct Tensor3Arg {
  void* data;
  int32_t shapes[3];
  int64_t strides[2];
};

// A GEMM kernel's arguments: x [M, K], w [N, K], gate_bias [1, N] (w's dtype; without one a
// stand-in, never read: has_gate_bias = 0), out [M, N].
struct GemmArgs {
  TensorArg x, w, gate_bias, out;
  int32_t has_gate_bias;
};

using LaunchFn = int32_t (*)(GemmArgs* args, cudaStream_t stream);
using ModuleFn = void (*)(void** args);

// One compiled kernel: a variant row compiled for one vector width, hidden_states dtype,
// output dtype and arch.
struct CompiledKernel {
  const char* symbol;
  int variant;  // index into kVariantRows
  int vec;
  c10::ScalarType x_dtype;
  c10::ScalarType out_dtype;
  int sm;  // compute capability it runs on, major * 10 + minor
  ModuleFn init;  // loads the embedded cubin (once per process)
  ModuleFn load_to_device;  // sets the kernel's attributes on one device
  LaunchFn launch;
};

// The fused router's arguments (kernels/ll_bf16_router.py); gate_bias, bias, weights, ids
// and handoff are rank-2 as well ([1, N], [1, N], [M, top_k], [M, top_k], [M, N]).
struct RouterArgs {
  TensorArg x, w, gate_bias, bias, logits, weights, ids, handoff;
  int32_t top_k, n_group, topk_group, renormalize, has_bias, softmax;
  float scaling;
  int32_t has_gate_bias;
};

using RouterLaunchFn = int32_t (*)(RouterArgs* args, cudaStream_t stream);

struct CompiledRouterKernel {
  const char* symbol;
  int router;  // index into kRouterRows
  c10::ScalarType bias_dtype;
  int sm;
  ModuleFn init;
  ModuleFn load_to_device;
  RouterLaunchFn launch;
};

// The routing op's arguments (kernels/moe_routing.py): logits [M, N], bias [1, N], weights
// and ids [M, top_k].
struct RoutingArgs {
  TensorArg logits, bias, weights, ids;
  int32_t top_k, n_group, topk_group, renormalize, has_bias, softmax;
  float scaling;
};

using RoutingLaunchFn = int32_t (*)(RoutingArgs* args, cudaStream_t stream);

struct CompiledRoutingKernel {
  const char* symbol;
  int n_min, n_max;  // the experts it routes
  c10::ScalarType logits_dtype, bias_dtype;
  int sm;
  ModuleFn init;
  ModuleFn load_to_device;
  RoutingLaunchFn launch;
};

// The norm kernels' arguments (kernels/rms_norm.py): x, residual, out, residual_out are
// [M, K]; weight is [1, K]. rms_norm passes x as residual and out as residual_out (unused).
struct NormArgs {
  TensorArg x, residual, weight, out, residual_out;
  float eps;
};

using NormLaunchFn = int32_t (*)(NormArgs* args, cudaStream_t stream);

struct CompiledNormKernel {
  const char* symbol;
  bool add_residual;  // fused_add_rms_norm
  int vec;
  int sm;
  ModuleFn init;
  ModuleFn load_to_device;
  NormLaunchFn launch;
};

// Kimi-K3's AttnRes (kernels/attn_res.py): prefix, delta, out [M, H]; the weights [1, H];
// blocks [M, R, H]. Without a delta, prefix stands in for it (unread); without an output
// norm weight, norm_weight does.
struct AttnResArgs {
  TensorArg prefix, delta, norm_weight, qk_weight, output_norm_weight, out;
  Tensor3Arg blocks;
  int32_t num_blocks, block_write_idx, has_delta, has_output_norm;
  float eps, output_norm_eps;
};

using AttnResLaunchFn = int32_t (*)(AttnResArgs* args, cudaStream_t stream);

struct CompiledAttnResKernel {
  const char* symbol;
  int sm;
  ModuleFn init;
  ModuleFn load_to_device;
  AttnResLaunchFn launch;
};

}  // namespace kimi
