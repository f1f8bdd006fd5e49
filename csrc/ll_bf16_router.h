#pragma once

#include <string>
#include <tuple>

#include "kimi_tables.h"
#include "moe_routing.h"
#include "torch_stable.h"

namespace kimi {

// The router ops' input contract (every implementation calls it first): ll_bf16_router's
// (bf16 only, no gate bias) where op is "ll_bf16_router", router's otherwise.
void check_router_inputs(const char* op, const Tensor& x, const Tensor& w,
                         const OptionalTensor& bias, const OptionalTensor& gate_bias,
                         const RoutingParams& r);

// What the choice of a fused router row depends on besides the routing arguments.
struct RouterProblem {
  int64_t M, N, K;
  ScalarType x_dtype, weight_dtype;
  int64_t sm;
  bool vec16_ok;  // the inputs allow 16-byte loads of the weights
};

// The fused router row for a problem, or nullptr (the GEMM op's kernel, then the routing
// op's).
const RouterRow* choose_router(const RouterProblem& p, const RoutingParams& r);

// Why `row` cannot run a problem ("" if it can).
std::string router_row_misfit(const RouterRow& row, const RouterProblem& p,
                              const RoutingParams& r);

// The router table row called `name`; an error listing the valid names if there is none.
const RouterRow& router_row_by_name(const std::string& name);

}  // namespace kimi
