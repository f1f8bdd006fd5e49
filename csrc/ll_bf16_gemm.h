#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "variant_row.h"

namespace kimi {

// The op's input contract; every implementation (CPU, CUDA) calls it first, and ops.py's
// fake implementation checks the same things with the same messages.
// "torch.float32", as Python prints a dtype (the fake kernels' messages say the same).
std::string dtype_name(c10::ScalarType t);

// `op` names the op in the messages.
void check_inputs(const at::Tensor& hidden_states, const at::Tensor& router_weight,
                  c10::ScalarType out_dtype, const char* op = "ll_bf16_gemm");

// Whether the CuTe DSL kernels can run a problem at all on a GPU of compute capability sm.
bool kernels_support(int64_t sm, int64_t N, int64_t K);

// Which kernel runs for a problem. row == nullptr means cuBLAS (at::mm).
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

}  // namespace kimi
