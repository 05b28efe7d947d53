// The host device: runtime/device.h's Device emulated on CPU threads, so the hybrid runtime and its
// policies run (and are tested) without a GPU. make_host_device() and parse_link() are declared in
// runtime/device.h; this header names the emulation's constants.
//
// Emulation (docs/device.md): device memory is one aligned host buffer of memory_bytes managed by
// a first-fit free list; each stream is a host thread running its queue in order; copies go through
// one emulated link per direction (h2d, d2h) shared by every stream, paced chunk by chunk to
// latency + bytes / bandwidth; ffn / matmul / add run the CPU kernels (kern::matmul, ops::silu) on
// the device's own unpinned ThreadPool, so device compute never takes the CPU backend's workers.
#pragma once

#include <cstdint>

#include "runtime/device.h"

namespace tandem::rt {

// Link pacing granularity: concurrent copies in one direction interleave at this size, so they
// share the bandwidth like PCIe transfers do.
inline constexpr uint64_t kHostLinkChunkBytes = 256 * 1024;
// Device allocations are aligned (and rounded) to this, like cudaMalloc's 256-byte alignment.
inline constexpr uint64_t kHostDeviceAlign = 256;

}  // namespace tandem::rt
