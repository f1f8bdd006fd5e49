// Counters for the fused router (see router_counters.h for who gets which).

#include "router_counters.h"

#include <map>
#include <mutex>
#include <vector>

#include "kernel_support.h"

namespace kimi {

namespace {

constexpr int kChunk = 1024;  // counters per allocation

struct CounterPool {
  std::mutex mutex;
  std::map<cudaStream_t, int32_t*> by_stream;
  std::vector<int32_t*> free_counters;  // zeroed, never handed out
};

// Fresh zeroed counters. This may run inside graph capture (the first call of a process,
// or any captured call), where memory may be allocated in relaxed mode but nothing may be
// queued on the capturing stream: zero them on a private stream and wait for it.
void refill(std::vector<int32_t*>& counters) {
  RelaxedCaptureMode relaxed;
  int32_t* chunk = nullptr;
  check_cuda(cudaMalloc(&chunk, kChunk * sizeof(int32_t)), "allocating", "router counters");
  cudaStream_t zeroing = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&zeroing, cudaStreamNonBlocking), "creating a stream for",
             "router counters");
  const cudaError_t set = cudaMemsetAsync(chunk, 0, kChunk * sizeof(int32_t), zeroing);
  const cudaError_t done = cudaStreamSynchronize(zeroing);
  cudaStreamDestroy(zeroing);
  check_cuda(set, "zeroing", "router counters");
  check_cuda(done, "zeroing", "router counters");
  for (int i = kChunk - 1; i >= 0; --i) {
    counters.push_back(chunk + i);
  }
}

int32_t* take(std::vector<int32_t*>& counters) {
  if (counters.empty()) {
    refill(counters);
  }
  int32_t* counter = counters.back();
  counters.pop_back();
  return counter;
}

}  // namespace

int32_t* router_counter(int device, cudaStream_t stream) {
  static CounterPool pools[kMaxDevices];
  TORCH_CHECK(device >= 0 && device < kMaxDevices, "kimi_router_ops: device index ", device,
              " >= ", kMaxDevices);
  CounterPool& pool = pools[device];
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream, &capture), "querying capture of", "the stream");
  const std::lock_guard<std::mutex> lock(pool.mutex);
  if (capture != cudaStreamCaptureStatusNone) {
    return take(pool.free_counters);
  }
  int32_t*& counter = pool.by_stream[stream];
  if (counter == nullptr) {
    counter = take(pool.free_counters);
  }
  return counter;
}

}  // namespace kimi
