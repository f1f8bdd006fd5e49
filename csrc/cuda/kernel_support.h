#pragma once
// Loading the ahead-of-time kernels and preparing their arguments, for every op's dispatch.

#include <ATen/core/Tensor.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/util/Exception.h>
#include <cuda_runtime.h>

#include <mutex>

#include "../kernel_abi.h"

namespace kimi {

// Devices a process may use with these kernels (per-device state is kept in arrays).
constexpr int kMaxDevices = 64;

inline int device_sm(int device) {
  const cudaDeviceProp* props = at::cuda::getDeviceProperties(device);
  return props->major * 10 + props->minor;
}

inline void check_cuda(cudaError_t err, const char* what, const char* symbol) {
  TORCH_CHECK(err == cudaSuccess, "kimi_router_ops: ", what, " ", symbol, " failed: ",
              cudaGetErrorString(err));
}

// The first call in a process may happen inside CUDA-graph capture. Loading a library or
// allocating is not stream work, but the global capture mode forbids it on any thread;
// relaxed mode for the duration lets it through without touching the captured stream.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCaptureMode() { cudaThreadExchangeStreamCaptureMode(&mode_); }

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};

// Loads one table's kernels for a device, once: the embedded cubin of each once per
// process, then the per-device attributes. Devices load lazily, so a process touches only
// GPUs it uses. Kernel is CompiledKernel or CompiledRouterKernel (kernel_abi.h).
template <typename Kernel, size_t kCount>
void ensure_loaded(const Kernel (&kernels)[kCount], int device) {
  static cudaLibrary_t libraries[kCount];
  static std::once_flag kernel_once[kCount];
  static std::once_flag device_once[kMaxDevices];
  TORCH_CHECK(device < kMaxDevices, "kimi_router_ops: device index ", device, " >= ", kMaxDevices);
  std::call_once(device_once[device], [&kernels, device] {
    RelaxedCaptureMode relaxed;
    const int sm = device_sm(device);
    for (size_t i = 0; i < kCount; ++i) {
      const Kernel& kernel = kernels[i];
      if (kernel.sm != sm) {
        continue;
      }
      std::call_once(kernel_once[i], [&] {
        cudaLibrary_t* library = &libraries[i];
        cudaError_t err = cudaSuccess;
        struct {
          cudaLibrary_t** library;
          cudaError_t* err;
        } args = {&library, &err};
        kernel.init(reinterpret_cast<void**>(&args));
        check_cuda(err, "loading", kernel.symbol);
      });
      cudaLibrary_t* library = &libraries[i];
      int32_t device_id = device;
      cudaError_t err = cudaSuccess;
      struct {
        cudaLibrary_t** library;
        int32_t* device_id;
        cudaError_t* err;
      } args = {&library, &device_id, &err};
      kernel.load_to_device(reinterpret_cast<void**>(&args));
      check_cuda(err, "preparing", kernel.symbol);
    }
  });
}

// Sizes-one dimensions have arbitrary strides; give them the contiguous one so the
// alignment test below is not fooled by a stride that is never used.
inline int64_t row_stride(const at::Tensor& t) { return t.size(0) == 1 ? t.size(1) : t.stride(0); }

// A [rows, cols] tensor with unit inner stride as an exported kernel's argument.
inline TensorArg matrix_arg(const at::Tensor& t) {
  return {t.data_ptr(), {int32_t(t.size(0)), int32_t(t.size(1))}, {row_stride(t)}};
}

inline bool vec8_aligned(const at::Tensor& t) {
  return t.size(1) % 8 == 0 && row_stride(t) % 8 == 0 &&
         reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// Unit stride along K is the kernels' one layout requirement; other layouts are copied once.
inline at::Tensor unit_inner_stride(const at::Tensor& t) {
  return (t.stride(1) == 1 || t.size(1) == 1) ? t : t.contiguous();
}

}  // namespace kimi
