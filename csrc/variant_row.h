#pragma once

#include <torch/headeronly/core/ScalarType.h>

#include <cstdint>

namespace kimi {

// One row of the variant table (kimi_router_ops/variants.py, emitted as kimi_variant_table.h).
struct VariantRow {
  const char* name;
  int m_hi;  // a dot product's token bucket
  int max_m;  // the largest M the kernel computes
  bool scalar_loads;  // also compiled with scalar loads (any K, any alignment)
  int vec16;  // elements per 16-byte load: 8 (bf16 weights) or 4 (fp32)
  c10::ScalarType weight_dtype;
};

// One line of the automatic choice (CHOICES): the kernel for m_lo <= M <= m_hi,
// n_min <= N <= n_max, k_min <= K <= k_max, first match; variant -1 is cuBLAS.
struct ChoiceRow {
  int variant;  // index into kVariantRows, or -1
  int m_lo, m_hi;
  int64_t n_min, n_max, k_min, k_max;
  c10::ScalarType weight_dtype;
};

// One row of the fused router table (ROUTER_VARIANTS): a GEMM kernel plus routing.
struct RouterRow {
  const char* name;
  int m_lo;  // chosen for m_lo <= M <= m_hi and n_min <= N <= n_max (first match)
  int m_hi;
  int n_min;
  int n_max;  // also the most experts its routing handles (compiled in)
  bool automatic;  // false: run only when asked for by name
  c10::ScalarType weight_dtype;  // of its GEMM row
};

}  // namespace kimi
