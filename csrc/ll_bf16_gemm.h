#pragma once

#include <string>
#include <vector>

#include "torch_stable.h"
#include "kimi_tables.h"

namespace kimi {

// The GEMM's input contract, checked only here: every implementation (CPU, CUDA) calls it
// first (ops.py's fake kernels give shapes and dtypes only). `op` names the op in the
// messages. The ll_bf16_* ops take bf16 only; router_gemm and router also take fp32
// router weights (with bf16 or fp32 hidden_states) and a gate bias of the weights' dtype.
void check_inputs(const Tensor& hidden_states, const Tensor& router_weight, ScalarType out_dtype,
                  const char* op = "ll_bf16_gemm");
void check_router_gemm_inputs(const Tensor& hidden_states, const Tensor& router_weight,
                              const OptionalTensor& gate_bias, ScalarType out_dtype,
                              const char* op, const char* bias_name = "bias");

// The reference: exact products in fp32 (bf16 inputs widened), fp32 accumulation, the gate
// bias added in fp32, one final rounding.
Tensor gemm_reference(const Tensor& x, const Tensor& w, const OptionalTensor& gate_bias,
                      ScalarType out_dtype);

// Batch-invariant mode: a token's logits, ids and weights are the same bits whatever other
// tokens share its call (every M sums as M = 1 does: the kernels of
// tables.gemm.BATCH_INVARIANT_CHOICES, cuBLAS or the CPU's reference one token at a time, the
// router's two launches). Off by default; on at load with KIMI_ROUTER_OPS_BATCH_INVARIANT=1,
// or set by the set_batch_invariant op. Read by every call, so graphs captured or compiled
// before a change keep the kernels they were captured with.
bool batch_invariant();

// Whether the CuTe DSL kernels can run a problem at all on a GPU of compute capability sm.
bool kernels_support(int64_t sm, int64_t N, int64_t K);

// Which kernel runs for a problem. row == nullptr means cuBLAS (aten::mm). vec16_ok: the
// inputs allow 16-byte loads (the row's vec16 elements); a bf16 row with scalar loads
// runs them otherwise.
struct Choice {
  const VariantRow* row;
  int vec;
};
Choice choose_kernel(int64_t M, int64_t N, int64_t K, int64_t sm, ScalarType weight_dtype,
                     bool vec16_ok);
std::string describe(const Choice& choice);

// Elements of one 16-byte load of router weights of this dtype: 8 (bf16) or 4 (fp32).
int vec16_elements(ScalarType weight_dtype);

// The table row called `name`; an error listing the valid names if there is none.
const VariantRow& variant_by_name(const std::string& name);

// The CUDA kernels linked into this build (empty without CUDA).
std::vector<std::string> compiled_kernel_symbols();

#ifdef KIMI_WITH_CUDA
// The GEMM of checked CUDA inputs on the current stream: the chosen kernel, or cuBLAS
// (csrc/ll_bf16_gemm.cpp). Into `into` where given (out_dtype [M, N], unit stride
// along N: the kernels write it, cuBLAS's result is copied in), which it returns.
Tensor gemm_on_gpu(const Tensor& x, const Tensor& w, const OptionalTensor& gate_bias,
                   ScalarType out_dtype, const Tensor* into = nullptr);

// Whether x and w allow 16-byte loads of w (vec16_elements a load; x's loads take as many).
bool vec16_ok(const Tensor& x, const Tensor& w);
#endif

}  // namespace kimi
