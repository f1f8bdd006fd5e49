#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kimi {

// Words of one token's row of a handoff buffer: its N scores, then one 64-bit pair word per
// tile of 16 experts, 8-byte aligned (kernels/handoff.py, row_words).
constexpr int64_t handoff_row_words(int64_t n) { return (n + 1) / 2 * 2 + 2 * ((n + 15) / 16); }

// The handoff buffer of one fused-router launch on `stream` (current device): `words` int32
// (the call's M * handoff_row_words(N)), all bits set between calls (kernels/handoff.py). The GEMM part of the
// kernel publishes each logit there and the routing warps empty each word again, so a
// buffer can serve one call after another but never two calls at once.
//
// Calls on one stream run one after another (the kernel touches the buffer only after its
// PDL wait, which returns once the previous kernel has finished), so each stream has a
// buffer, sized for the largest call the fused kernels take. A call captured into a CUDA
// graph gets a buffer of its own, used by that graph's replays only: graphs may be replayed
// on any stream, side by side. Buffers are never freed (72 KiB per stream; 4 * M * handoff_row_words(N)
// bytes, rounded up to 16, per captured call).
int32_t* router_handoff(int device, cudaStream_t stream, int64_t words);

}  // namespace kimi
