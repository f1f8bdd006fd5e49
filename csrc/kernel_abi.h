#pragma once
// The C interface of the kernels exported by kimi_router_ops.aot (CuTe DSL export_to_c).

#include <cuda_runtime.h>
#include <cstdint>

namespace kimi {

// Layout of every exported tensor argument: a rank-2 tensor whose two sizes and outer
// stride are run-time values (the inner stride is 1 by construction).
struct TensorArg {
  void* data;
  int32_t shapes[2];
  int64_t strides[1];
};

// A rank-3 tensor argument (AttnRes's blocks [M, R, H]): three sizes, two outer strides.
struct Tensor3Arg {
  void* data;
  int32_t shapes[3];
  int64_t strides[2];
};

using ModuleFn = void (*)(void** args);

// Each family's argument struct (<Family>Args), compiled-kernel struct (<Family>Kernel) and
// table (k<Family>Kernels) are generated with the kernels (kimi_router_ops/aot/cpp.py,
// kimi_kernels.h), from the record that compiles them.

}  // namespace kimi
