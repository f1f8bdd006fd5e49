#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kimi {

// A zeroed int32 counter for one fused-router launch on `stream` (current device).
//
// The fused router's CTAs count themselves done on it and the last one sets it back to
// zero, so a counter can serve one call after another but never two calls at once. Calls
// on one stream run one after another (the kernel counts only after its PDL wait, which
// returns once the previous kernel has finished), so each stream has its own counter. A
// call captured into a CUDA graph gets a counter of its own, used by that graph's replays
// only: graphs may be replayed on any stream, side by side. Counters are never freed
// (4 bytes per stream and per captured call).
int32_t* router_counter(int device, cudaStream_t stream);

}  // namespace kimi
