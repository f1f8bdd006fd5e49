// CUDA implementation of attn_res: the PDL-launched CuTe DSL kernel (one token a cluster of
// CTAs) on the GPUs it was compiled for and the inputs it serves, the ATen reference
// elsewhere.

#include <limits>

#include "kernel_support.h"
#include "../attn_res.h"

namespace kimi {

namespace {

// blocks [M, R, H] as the kernel's argument; strides of size-one dimensions, never used, are
// given their contiguous values so the alignment test is not fooled by them.
Tensor3Arg blocks_arg(const Tensor& b) {
  const int64_t h = b.size(2);
  const int64_t r_stride = b.size(1) == 1 ? h : b.stride(1);
  const int64_t m_stride = b.size(0) == 1 ? b.size(1) * r_stride : b.stride(0);
  return {b.data_ptr(), {int32_t(b.size(0)), int32_t(b.size(1)), int32_t(h)}, {m_stride, r_stride}};
}

bool vec8_aligned(const Tensor3Arg& a) {
  return a.strides[0] % 8 == 0 && a.strides[1] % 8 == 0 &&
         (a.shapes[1] == 0 || reinterpret_cast<uintptr_t>(a.data) % 16 == 0);
}

// Runs the kernel into out; false where it does not serve the inputs (they are unchanged).
bool launch_attn_res(const AttnResCall& call, const Tensor& out) {
  const auto& [prefix, delta, blocks, norm_weight, qk_weight, output_norm_weight, num_blocks,
                block_write_idx, eps, output_norm_eps, op] = call;
  const int device = prefix.get_device_index();
  const AttnResKernel* kernel =
      find_kernel(kAttnResKernels, device_sm(device), [](const AttnResKernel&) { return true; });
  const int64_t m = prefix.size(0), h = prefix.size(1);
  // One cluster a token (grid y).
  if (kernel == nullptr || !attn_res_kernel_misfit(h, num_blocks, device_sm(device)).empty() ||
      m > 65535 || blocks.size(1) > std::numeric_limits<int32_t>::max()) {
    return false;
  }
  const Tensor nw = unit_stride_vector(norm_weight), qw = unit_stride_vector(qk_weight);
  const Tensor ow = output_norm_weight.has_value() ? unit_stride_vector(*output_norm_weight) : nw;
  AttnResArgs args{};
  args.prefix = matrix_arg(prefix);
  args.delta = matrix_arg(delta.has_value() ? *delta : prefix);
  args.blocks = blocks_arg(blocks);
  args.norm_weight = row_arg(nw);
  args.qk_weight = row_arg(qw);
  args.output_norm_weight = row_arg(ow);
  args.out = matrix_arg(out);
  args.num_blocks = int32_t(num_blocks);
  args.block_write_idx = int32_t(block_write_idx);
  args.has_delta = delta.has_value();
  args.has_output_norm = output_norm_weight.has_value();
  args.eps = float(eps);
  args.output_norm_eps = float(output_norm_eps);
  for (const TensorArg* a : {&args.prefix, &args.delta, &args.norm_weight, &args.qk_weight,
                             &args.output_norm_weight, &args.out}) {
    if (!vec8_aligned(*a)) {
      return false;
    }
  }
  if (!vec8_aligned(args.blocks)) {
    return false;
  }
  if (m == 0) {
    return true;
  }
  launch_kernel(kAttnResKernels, *kernel, args, device, current_stream(device));
  return true;
}

}  // namespace

Tensor attn_res_on_gpu(const AttnResCall& call) {
  const DeviceGuard guard(call.prefix.get_device_index());
  Tensor out = empty_on(call.prefix, {call.prefix.size(0), call.prefix.size(1)}, kBFloat16);
  return launch_attn_res(call, out) ? out : attn_res_reference(call);
}

STABLE_TORCH_LIBRARY_IMPL(kimi, CUDA, m) {
  m.impl("attn_res", TORCH_BOX(&attn_res_op<attn_res_on_gpu>));
}

}  // namespace kimi
