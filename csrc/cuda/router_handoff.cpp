// Handoff buffers for the fused router (see router_handoff.h for who gets which).

#include "router_handoff.h"

#include <algorithm>
#include <map>
#include <mutex>

#include "kernel_support.h"
#include "kimi_tables.h"

namespace kimi {

namespace {

constexpr size_t kChunkBytes = size_t(1) << 20;
// A per-stream buffer holds the largest M * N any fused router row serves.
constexpr int64_t kStreamWords = int64_t(kRouterMaxM) * kRouterMaxN;

// Every byte all ones: every word is kernels/handoff.py's EMPTY.
constexpr int kEmptyByte = 0xFF;

// Device memory handed out in pieces from chunks of EMPTY words, never freed.
class EmptyArena {
 public:
  void* take(size_t bytes) {
    bytes = (bytes + 15) / 16 * 16;  // 16-byte pieces
    if (bytes > left_) {
      refill(std::max(bytes, kChunkBytes));
    }
    void* piece = next_;
    next_ += bytes;
    left_ -= bytes;
    return piece;
  }

 private:
  // This may run inside graph capture (the first call of a process, or any captured call),
  // where memory may be allocated in relaxed mode but nothing may be queued on the
  // capturing stream: fill the chunk on a private stream and wait for it.
  void refill(size_t bytes) {
    RelaxedCaptureMode relaxed;
    char* chunk = nullptr;
    check_cuda(cudaMalloc(&chunk, bytes), "allocating", "a router workspace");
    cudaStream_t filling = nullptr;
    check_cuda(cudaStreamCreateWithFlags(&filling, cudaStreamNonBlocking), "creating a stream for",
               "router workspaces");
    const cudaError_t set = cudaMemsetAsync(chunk, kEmptyByte, bytes, filling);
    const cudaError_t done = cudaStreamSynchronize(filling);
    cudaStreamDestroy(filling);
    check_cuda(set, "filling", "a router workspace");
    check_cuda(done, "filling", "a router workspace");
    next_ = chunk;
    left_ = bytes;
  }

  char* next_ = nullptr;
  size_t left_ = 0;
};

struct HandoffPool {
  std::mutex mutex;
  std::map<cudaStream_t, int32_t*> by_stream;
  EmptyArena empty;

  int32_t* take(int64_t words) {
    return static_cast<int32_t*>(empty.take(size_t(words) * sizeof(int32_t)));
  }
};

}  // namespace

int32_t* router_handoff(int device, cudaStream_t stream, int64_t words) {
  static HandoffPool pools[kMaxDevices];
  check_device_index(device);
  KIMI_CHECK(words <= kStreamWords, "kimi_router_ops: a router handoff of ", words,
             " words > ", kStreamWords);
  HandoffPool& pool = pools[device];
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream, &capture), "querying capture of", "the stream");
  const std::lock_guard<std::mutex> lock(pool.mutex);
  if (capture != cudaStreamCaptureStatusNone) {
    return pool.take(words);
  }
  int32_t*& buffer = pool.by_stream[stream];
  if (buffer == nullptr) {
    buffer = pool.take(kStreamWords);
  }
  return buffer;
}

}  // namespace kimi
