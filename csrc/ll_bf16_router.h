#pragma once

#include <string>
#include <tuple>

#include "moe_routing.h"
#include "torch_stable.h"
#include "variant_row.h"

namespace kimi {

// The router op's input contract (every implementation calls it first).
void check_router_inputs(const Tensor& x, const Tensor& w, const OptionalTensor& bias,
                         int64_t top_k, int64_t n_group, int64_t topk_group, Scoring scoring);

// The fused router row for a problem on a GPU of compute capability sm, or nullptr (the
// GEMM op's kernel, then the routing op's).
const RouterRow* choose_router(int64_t M, int64_t N, int64_t K, int64_t top_k, int64_t n_group,
                               int64_t topk_group, int64_t sm, bool vec8_ok);

// Why `row` cannot run a problem ("" if it can).
std::string router_row_misfit(const RouterRow& row, int64_t M, int64_t N, int64_t K,
                              int64_t top_k, int64_t n_group, int64_t topk_group, int64_t sm,
                              bool vec8_ok);

// The router table row called `name`; an error listing the valid names if there is none.
const RouterRow& router_row_by_name(const std::string& name);

}  // namespace kimi
