#pragma once
// Loading the ahead-of-time kernels and preparing their arguments, for every op's dispatch.

#include <cuda_runtime.h>

#include <mutex>

#include <torch/csrc/stable/accelerator.h>

#include "../moe_routing.h"
#include "../torch_stable.h"
#include "kimi_kernels.h"

namespace kimi {

// Devices a process may use with these kernels (per-device state is kept in arrays).
constexpr int kMaxDevices = 64;

inline void check_cuda(cudaError_t err, const char* what, const char* symbol) {
  KIMI_CHECK(err == cudaSuccess, "kimi_router_ops: ", what, " ", symbol, " failed: ",
             cudaGetErrorString(err));
}

inline void check_device_index(int device) {
  KIMI_CHECK(device >= 0 && device < kMaxDevices, "kimi_router_ops: device index ", device,
             " >= ", kMaxDevices);
}

// Compute capability, major * 10 + minor; asked of the runtime once per device.
inline int device_sm(int device) {
  static int sm[kMaxDevices];
  static std::once_flag once[kMaxDevices];
  check_device_index(device);
  std::call_once(once[device], [device] {
    int major = 0, minor = 0;
    check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
               "querying", "the compute capability");
    check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device),
               "querying", "the compute capability");
    sm[device] = major * 10 + minor;
  });
  return sm[device];
}

// Streaming multiprocessors of a device; asked of the runtime once per device.
inline int device_sm_count(int device) {
  static int count[kMaxDevices];
  static std::once_flag once[kMaxDevices];
  check_device_index(device);
  std::call_once(once[device], [device] {
    check_cuda(cudaDeviceGetAttribute(&count[device], cudaDevAttrMultiProcessorCount, device),
               "querying", "the SM count");
  });
  return count[device];
}

// torch's current stream on `device`.
inline cudaStream_t current_stream(int device) {
  void* stream = nullptr;
  KIMI_SHIM_CHECK(aoti_torch_get_current_cuda_stream(device, &stream));
  return static_cast<cudaStream_t>(stream);
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
// GPUs it uses. Kernel is one of the generated <Family>Kernel structs (kimi_kernels.h).
template <typename Kernel, size_t kCount>
void ensure_loaded(const Kernel (&kernels)[kCount], int device) {
  static cudaLibrary_t libraries[kCount];
  static std::once_flag kernel_once[kCount];
  static std::once_flag device_once[kMaxDevices];
  check_device_index(device);
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

// The kernel of `table` compiled for compute capability sm that `matches`, or nullptr.
template <typename Kernel, size_t kCount, typename Match>
const Kernel* find_kernel(const Kernel (&table)[kCount], int sm, Match matches) {
  for (const Kernel& kernel : table) {
    if (kernel.sm == sm && matches(kernel)) {
      return &kernel;
    }
  }
  return nullptr;
}

// Launches one kernel of `table` on `stream` of `device` (loading the table there first).
template <typename Kernel, size_t kCount>
void launch_kernel(const Kernel (&table)[kCount], const Kernel& kernel,
                   typename Kernel::Args& args, int device, cudaStream_t stream) {
  ensure_loaded(table, device);
  check_cuda(static_cast<cudaError_t>(kernel.launch(&args, stream)), "launching", kernel.symbol);
}

// Sizes-one dimensions have arbitrary strides; give them the contiguous one so the
// alignment test below is not fooled by a stride that is never used.
inline int64_t row_stride(const Tensor& t) { return t.size(0) == 1 ? t.size(1) : t.stride(0); }

// A [rows, cols] tensor with unit inner stride as an exported kernel's argument.
inline TensorArg matrix_arg(const Tensor& t) {
  return {t.data_ptr(), {int32_t(t.size(0)), int32_t(t.size(1))}, {row_stride(t)}};
}

// A unit-stride vector as the [1, n] row an exported kernel takes; n defaults to its length
// (a stand-in for an absent vector, which the kernel is told not to read, passes the N it
// would read).
inline TensorArg row_arg(const Tensor& v, int64_t n) {
  return {v.data_ptr(), {1, int32_t(n)}, {n}};
}
inline TensorArg row_arg(const Tensor& v) { return row_arg(v, v.size(0)); }

// Whether an argument allows the kernels' 16-byte loads.
inline bool vec8_aligned(const TensorArg& a) {
  return a.shapes[1] % 8 == 0 && a.strides[0] % 8 == 0 &&
         reinterpret_cast<uintptr_t>(a.data) % 16 == 0;
}
inline bool vec8_aligned(const Tensor& t) { return vec8_aligned(matrix_arg(t)); }

// Unit stride along K is the kernels' one layout requirement; other layouts are copied once.
inline Tensor unit_inner_stride(const Tensor& t) {
  return (t.stride(1) == 1 || t.size(1) == 1) ? t : torch::stable::contiguous(t);
}

// A vector with unit stride: itself, without a call into torch, when it has one already.
inline Tensor unit_stride_vector(const Tensor& v) {
  return (v.stride(0) == 1 || v.size(0) == 1) ? v : torch::stable::contiguous(v);
}

// A hash-routed call's input_ids [M] and hash_table [V, top_k] (int32 or int64) as the
// routing kernels' int32 words, an int64 two of them, its low word first (the kernels read
// both: RoutingParams::kernel_scalars says how many). Without them, `standin` for both: the
// kernels read neither. The tensors copied to a unit inner stride live here until the launch.
struct HashArgs {
  TensorArg input_ids, hash_table;
  Tensor ids_kept, table_kept;
};
inline HashArgs hash_args(const OptionalTensor& input_ids, const OptionalTensor& hash_table,
                          const Tensor& standin) {
  if (!hash_table.has_value()) {
    return {matrix_arg(standin), matrix_arg(standin), standin, standin};
  }
  const Tensor ids = unit_stride_vector(*input_ids);
  const Tensor table = unit_inner_stride(*hash_table);
  const int64_t ids_words = ids.scalar_type() == ScalarType::Long ? 2 : 1;
  const int64_t table_words = table.scalar_type() == ScalarType::Long ? 2 : 1;
  const int64_t ids_length = ids.size(0) * ids_words;
  return {{ids.data_ptr(), {1, int32_t(ids_length)}, {ids_length}},
          {table.data_ptr(), {int32_t(table.size(0)), int32_t(table.size(1) * table_words)},
           {row_stride(table) * table_words}},
          ids, table};
}

// The x·Wᵀ operands of a GEMM, router or projection kernel's Args: x [M, K], w [N, K] and the
// gate bias as a [1, N] row; without one, w stands in and the kernel runs with
// has_gate_bias = 0, never reading it. Returns the gate bias tensor (a unit-stride copy where
// needed), which must live until the launch.
template <typename Args>
Tensor put_gemm_operands(Args& args, const Tensor& x, const Tensor& w, const OptionalTensor& gate_bias) {
  const Tensor gate = gate_bias.has_value() ? unit_stride_vector(*gate_bias) : w;
  args.x = matrix_arg(x);
  args.w = matrix_arg(w);
  args.gate_bias = row_arg(gate, w.size(0));
  args.has_gate_bias = gate_bias.has_value();
  return gate;
}

// A routing kernel's outputs (RoutingArgs, RouterArgs): topk_weights; topk_ids as int32
// words (an int64 id two of them, its low word first: the kernel writes both); the expert
// counts, or a stand-in the kernel never touches (has_counts = 0).
template <typename Args>
void put_routing_outputs(Args& args, const RoutingOutputs& out, int64_t N, const RoutingParams& r) {
  args.weights = matrix_arg(out.weights);
  const int32_t words = out.ids.scalar_type() == ScalarType::Long ? 2 : 1;
  args.ids = {out.ids.data_ptr(), {int32_t(out.ids.size(0)), int32_t(out.ids.size(1) * words)},
              {row_stride(out.ids) * words}};
  args.counts = out.counts.has_value() ? row_arg(*out.counts, N + r.shared_experts) : args.weights;
  args.routing.id_words = words;
  args.routing.has_counts = out.counts.has_value() ? 1 : 0;
}

// Makes a device current for the calls of a scope (and restores the previous one).
using DeviceGuard = torch::stable::accelerator::DeviceGuard;

}  // namespace kimi
