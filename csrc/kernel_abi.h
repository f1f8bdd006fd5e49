#pragma once
// The C interface of the kernels exported by kimi_router_ops/aot.py (CuTe DSL export_to_c).

#include <c10/core/ScalarType.h>
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

using LaunchFn = int32_t (*)(TensorArg* x, TensorArg* w, TensorArg* out, cudaStream_t stream);
using ModuleFn = void (*)(void** args);

// One compiled kernel: a variant row compiled for one vector width, output dtype and arch.
struct CompiledKernel {
  const char* symbol;
  int variant;  // index into kVariantRows
  int vec;
  c10::ScalarType out_dtype;
  int sm;  // compute capability it runs on, major * 10 + minor
  ModuleFn init;  // loads the embedded cubin (once per process)
  ModuleFn load_to_device;  // sets the kernel's attributes on one device
  LaunchFn launch;
};

}  // namespace kimi
