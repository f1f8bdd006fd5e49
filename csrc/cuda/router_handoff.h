#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kimi {

// The handoff buffer of one fused-router launch on `stream` (current device): `words` int32
// (the call's M * N), all bits set between calls (kernels/handoff.py). The GEMM part of the
// kernel publishes each logit there and the routing warps empty each word again, so a
// buffer can serve one call after another but never two calls at once.
//
// Calls on one stream run one after another (the kernel touches the buffer only after its
// PDL wait, which returns once the previous kernel has finished), so each stream has a
// buffer, sized for the largest call the fused kernels take. A call captured into a CUDA
// graph gets a buffer of its own, used by that graph's replays only: graphs may be replayed
// on any stream, side by side. Buffers are never freed (64 KiB per stream; 4 * M * N bytes,
// rounded up to 16, per captured call).
int32_t* router_handoff(int device, cudaStream_t stream, int64_t words);

}  // namespace kimi
