#pragma once

namespace kimi {

// One row of the variant table (kimi_router_ops/variants.py, emitted as kimi_variant_table.h).
struct VariantRow {
  const char* name;
  int m_lo;  // chosen automatically for m_lo <= M <= m_hi and N >= n_min (first match)
  int m_hi;  // the compiled token bucket: the kernel is correct for any M <= m_hi
  int n_min;
  bool prefetch;
  bool pdl;
  bool automatic;  // false: run only when asked for by name
};

}  // namespace kimi
