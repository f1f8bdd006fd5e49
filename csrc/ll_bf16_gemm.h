#pragma once

#include <string>
#include <vector>

#include "torch_stable.h"
#include "variant_row.h"

namespace kimi {

// The op's input contract; every implementation (CPU, CUDA) calls it first, and ops.py's
// fake implementation checks the same things with the same messages.
// `op` names the op in the messages.
void check_inputs(const Tensor& hidden_states, const Tensor& router_weight, ScalarType out_dtype,
                  const char* op = "ll_bf16_gemm");

// The reference: exact bf16 -> fp32 products, fp32 accumulation, one final rounding.
Tensor gemm_reference(const Tensor& x, const Tensor& w, ScalarType out_dtype);

// Whether the CuTe DSL kernels can run a problem at all on a GPU of compute capability sm.
bool kernels_support(int64_t sm, int64_t N, int64_t K);

// Which kernel runs for a problem. row == nullptr means cuBLAS (aten::mm).
struct Choice {
  const VariantRow* row;
  int vec;
};
Choice choose_kernel(int64_t M, int64_t N, int64_t K, int64_t sm, bool vec8_ok);
std::string describe(const Choice& choice);

// The table row called `name`; an error listing the valid names if there is none.
const VariantRow& variant_by_name(const std::string& name);

// The CUDA kernels linked into this build (empty without CUDA).
std::vector<std::string> compiled_kernel_symbols();

#ifdef KIMI_WITH_CUDA
// The GEMM of checked CUDA inputs on the current stream: the chosen kernel, or cuBLAS
// (csrc/cuda/ll_bf16_gemm_cuda.cpp).
Tensor gemm_on_gpu(const Tensor& x, const Tensor& w, ScalarType out_dtype);
#endif

}  // namespace kimi
