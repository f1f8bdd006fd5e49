#pragma once

namespace kimi {

// One row of the variant table (kimi_router_ops/variants.py, emitted as kimi_variant_table.h).
struct VariantRow {
  const char* name;
  int m_lo;  // chosen automatically for m_lo <= M <= m_hi and n_min <= N <= n_max
  int m_hi;  // (first match)
  int max_m;  // the largest M the kernel computes (a dot product's token bucket)
  int n_min;
  int n_max;
  bool scalar_loads;  // also compiled with scalar loads (any K, any alignment)
  bool prefetch;
  bool pdl;
  bool automatic;  // false: run only when asked for by name
};

// One row of the fused router table (ROUTER_VARIANTS): a GEMM kernel plus routing.
struct RouterRow {
  const char* name;
  int m_lo;  // chosen for m_lo <= M <= m_hi and n_min <= N <= n_max (first match)
  int m_hi;
  int n_min;
  int n_max;  // also the most experts its routing handles (compiled in)
  bool automatic;  // false: run only when asked for by name
};

}  // namespace kimi
