// Kimi-K3's attention residual (AttnRes): the producer of the hidden states its MoE router
// reads, with vLLM 0.33's `attn_res` arguments in the same order. Exact formula, fp32 math
// from bf16 inputs:
//
//   p = bf16(prefix + delta)  (one rounding; p = prefix without a delta), written back into
//       prefix (with a delta) and into blocks[:, block_write_idx] (when >= 0)
//   sources v_s: blocks[:, s] for s < num_blocks (read after that write), then p
//   logit_s = (v_s . (norm_weight * qk_weight)) * rsqrt(mean(v_s^2) + eps)
//   mixed   = sum_s softmax_s(logit) v_s              (p alone when num_blocks == 0)
//   out     = bf16(mixed * rsqrt(mean(mixed^2) + output_norm_eps) * output_norm_weight)
//             (bf16(mixed) without an output norm weight)
//
// The CPU runs it as ATen ops (the reference); on Hopper and datacenter Blackwell the CUDA
// key runs the CuTe DSL kernel (below), which adds its sums in another
// order: an output may differ from the reference by a bf16 ulp.

#include <cmath>
#include <limits>
#include <sstream>
#include <vector>

#include "attn_res.h"
#include "kimi_tables.h"
#ifdef KIMI_WITH_CUDA
#include "cuda/kernel_support.h"
#endif

namespace kimi {

namespace {

void check_hidden_vector(const char* op, const char* name, const Tensor& t, const Tensor& prefix) {
  KIMI_CHECK(t.scalar_type() == kBFloat16, op, ": ", name, " must be torch.bfloat16, got ",
             dtype_name(t.scalar_type()));
  KIMI_CHECK(t.dim() == 1 && t.size(0) == prefix.size(1), op, ": ", name,
             " must have shape [H]=[", prefix.size(1), "], got ", t.sizes());
  KIMI_CHECK(t.device() == prefix.device(), op, ": prefix and ", name,
             " must be on the same device, got ", prefix.device(), " and ", t.device());
}

// Written in place or read as rows by the kernels: the hidden dimension must be contiguous
// (vLLM's function asserts the same).
void check_unit_last_stride(const char* op, const char* name, const Tensor& t) {
  KIMI_CHECK(t.stride(t.dim() - 1) == 1 || t.size(t.dim() - 1) <= 1, op, ": ", name,
             " must have stride 1 along its last dimension, got stride ", t.stride(t.dim() - 1));
}

Tensor f32(const Tensor& t) { return torch::stable::to(t, kFloat); }

Tensor rms_scale(const Tensor& v, double eps) {  // rsqrt(mean(v^2) + eps), [M, 1]
  return aten::rsqrt(aten::add(aten::mean_last(aten::mul(v, v)), aten::scalar(eps)));
}

}  // namespace

void check_attn_res_inputs(const AttnResCall& call) {
  const auto& [prefix, delta, blocks, norm_weight, qk_weight, output_norm_weight, num_blocks,
                block_write_idx, eps, output_norm_eps, op] = call;
  KIMI_CHECK(prefix.scalar_type() == kBFloat16, op, ": prefix must be torch.bfloat16, got ",
             dtype_name(prefix.scalar_type()));
  KIMI_CHECK(prefix.dim() == 2, op, ": prefix must be 2-D [M, H], got shape ",
             prefix.sizes());
  KIMI_CHECK(prefix.size(1) >= 1, op, ": H must be at least 1, got prefix ", prefix.sizes());
  check_unit_last_stride(op, "prefix", prefix);
  if (delta.has_value()) {
    KIMI_CHECK(delta->scalar_type() == kBFloat16, op, ": delta must be torch.bfloat16, got ",
               dtype_name(delta->scalar_type()));
    const Sizes ds = delta->sizes(), ps = prefix.sizes();
    KIMI_CHECK(ds.size() == ps.size() && std::equal(ds.begin(), ds.end(), ps.begin()),
               op, ": delta must have the shape of prefix ", ps, ", got ", ds);
    KIMI_CHECK(delta->device() == prefix.device(),
               op, ": prefix and delta must be on the same device, got ", prefix.device(),
               " and ", delta->device());
  }
  KIMI_CHECK(blocks.scalar_type() == kBFloat16, op, ": blocks must be torch.bfloat16, got ",
             dtype_name(blocks.scalar_type()));
  KIMI_CHECK(blocks.dim() == 3 && blocks.size(0) == prefix.size(0) &&
                 blocks.size(2) == prefix.size(1),
             op, ": blocks must have shape [M, R, H]=[", prefix.size(0), ", R, ",
             prefix.size(1), "], got ", blocks.sizes());
  KIMI_CHECK(blocks.device() == prefix.device(),
             op, ": prefix and blocks must be on the same device, got ", prefix.device(),
             " and ", blocks.device());
  check_unit_last_stride(op, "blocks", blocks);
  check_hidden_vector(op, "norm_weight", norm_weight, prefix);
  check_hidden_vector(op, "qk_weight", qk_weight, prefix);
  if (output_norm_weight.has_value()) {
    check_hidden_vector(op, "output_norm_weight", *output_norm_weight, prefix);
  }
  const int64_t r = blocks.size(1);
  KIMI_CHECK(num_blocks >= 0 && num_blocks <= r,
             op, ": num_blocks must be in [0, R] = [0, ", r, "], got ", num_blocks);
  KIMI_CHECK(block_write_idx >= -1 && block_write_idx < r,
             op, ": block_write_idx must be -1 or in [0, R) = [0, ", r, "), got ",
             block_write_idx);
  KIMI_CHECK(std::isfinite(eps) && eps >= 0, op, ": eps must be finite and >= 0, got ", eps);
  KIMI_CHECK(std::isfinite(output_norm_eps) && output_norm_eps >= 0,
             op, ": output_norm_eps must be finite and >= 0, got ", output_norm_eps);
}

Tensor attn_res_reference(const AttnResCall& call) {
  const auto& [prefix, delta, blocks, norm_weight, qk_weight, output_norm_weight, num_blocks,
                block_write_idx, eps, output_norm_eps, op] = call;
  const NoGradGuard no_grad;
  Tensor p = prefix;
  if (delta.has_value()) {
    p = torch::stable::to(aten::add(f32(prefix), f32(*delta)), kBFloat16);
    Tensor target = prefix;
    torch::stable::copy_(target, p);
  }
  if (block_write_idx >= 0) {
    Tensor target = torch::stable::select(blocks, 1, block_write_idx);
    torch::stable::copy_(target, p);
  }
  Tensor mixed = f32(p);
  if (num_blocks > 0) {
    // The softmax as vLLM's kernel runs it: the largest logit subtracted, the division last.
    const Tensor wq = aten::mul(f32(norm_weight), f32(qk_weight));
    std::vector<Tensor> values, logits;
    for (int64_t s = 0; s <= num_blocks; ++s) {
      values.push_back(s < num_blocks ? f32(torch::stable::select(blocks, 1, s)) : mixed);
      logits.push_back(aten::mul(aten::sum_last(aten::mul(values.back(), wq)),
                                 rms_scale(values.back(), eps)));
    }
    Tensor top = logits[0];
    for (const Tensor& logit : logits) {
      top = call_tensor_op("aten::maximum", "", top, logit);
    }
    Tensor denominator, sum;
    for (size_t s = 0; s < values.size(); ++s) {
      const Tensor e = call_tensor_op("aten::exp", "", torch::stable::subtract(logits[s], top));
      const Tensor term = aten::mul(e, values[s]);
      denominator = s == 0 ? e : aten::add(denominator, e);
      sum = s == 0 ? term : aten::add(sum, term);
    }
    mixed = aten::div(sum, denominator);
  }
  if (output_norm_weight.has_value()) {
    mixed = aten::mul(aten::mul(mixed, rms_scale(mixed, output_norm_eps)), f32(*output_norm_weight));
  }
  return torch::stable::contiguous(torch::stable::to(mixed, kBFloat16));
}


// prefix is written when a delta is given, blocks when block_write_idx >= 0.
std::string attn_res_kernel_misfit(int64_t hidden, int64_t num_blocks, int64_t sm) {
  // One cluster a token, one 16-byte vector of H a thread, the blocks' scores in registers.
  std::ostringstream why;
  if (!kernels_built_for(sm)) {
    why << "no AttnRes kernel for sm_" << sm;
  } else if (hidden < 1 || hidden % 8 != 0 || hidden > kAttnResMaxHidden) {
    why << "the AttnRes kernel takes H a multiple of 8 in [8, " << kAttnResMaxHidden
        << "], got H=" << hidden;
  } else if (num_blocks < 0 || num_blocks > kAttnResMaxBlocks) {
    why << "the AttnRes kernel takes num_blocks in [0, " << kAttnResMaxBlocks << "], got "
        << num_blocks;
  }
  return why.str();
}

STABLE_TORCH_LIBRARY_FRAGMENT(kimi, m) {
  m.def("attn_res(" KIMI_ATTN_RES_ARGS ") -> Tensor");
  m.def("attn_res_kernel_misfit(int hidden, int num_blocks, int sm=90) -> str");
}

STABLE_TORCH_LIBRARY_IMPL(kimi, CompositeExplicitAutograd, m) {
  m.impl("attn_res_kernel_misfit", TORCH_BOX(&attn_res_kernel_misfit));
}

STABLE_TORCH_LIBRARY_IMPL(kimi, CPU, m) {
  m.impl("attn_res", TORCH_BOX(&attn_res_op<attn_res_reference>));
}

#ifdef KIMI_WITH_CUDA

// CUDA implementation of attn_res: the PDL-launched CuTe DSL kernel (one token a cluster of
// CTAs) on the GPUs it was compiled for and the inputs it serves, the ATen reference
// elsewhere.

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

#endif  // KIMI_WITH_CUDA

}  // namespace kimi
