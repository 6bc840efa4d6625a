// CUDA devices visible to this process (the ops themselves are declared in cuda_ops.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dsi::cuda {

// Number of visible CUDA devices (GPUs); 0 when the driver or devices are missing (never throws).
int device_count();

// Device::cuda(i) names a logical device: GPU i. With GPU sharing on, logical devices i >= the
// number of GPUs exist too and run on GPU i mod that number, each with a stream and a memory pool of
// its own, as if it were another GPU: ranks can then outnumber the GPUs (tests and development runs
// of TP/DCP layouts on one GPU; their collectives go through peer_collectives.h, which works between
// streams of one GPU, not through NCCL, which refuses two ranks on one GPU). The speed of such runs
// says nothing about real ones. Off unless set_gpu_sharing(true) or DSI_SHARE_GPUS=1; turning it on
// also calls prepare_for_spinning_kernels(). With sharing, device memory comes from the
// stream-ordered allocator and launches skip programmatic dependent launch: nothing a rank does may
// wait for the whole GPU, where other ranks' kernels wait for this rank's.
void set_gpu_sharing(bool on);
bool gpu_sharing();

// Kernels that wait for kernels of other streams (the peer collectives) need the CUDA runtime set
// up for them before its first call (environment variables, read once; values already set are
// kept): CUDA_DEVICE_MAX_CONNECTIONS=32, hardware queues enough that no rank's kernel queues behind
// another's waiting one, and CUDA_MODULE_LOADING=EAGER, since loading a kernel lazily at its first
// launch may wait for the device to go idle (the CUDA lazy-loading guide's caveat about kernels
// that wait for each other).
void prepare_for_spinning_kernels();
// Makes now what this thread's first use of (logical) device i would make lazily: the device's
// stream, its pinned buffer for host copies (with sharing), this thread's cuBLAS and cuBLASLt
// handles and cuBLAS workspace. Some of that (the libraries' own cudaMalloc, cudaHostAlloc) is an
// implicit synchronisation of the GPU: made while another rank's collective kernel already waits
// for this rank's, it would never return. A rank thread prepares while none is in flight (thread
// ranks prepare, then meet at a host barrier; RankWorkers prepares the thread that calls run()).
// Cheap once done for (thread, i).
void prepare_thread(int i);
// The GPU logical device i runs on; throws dsi::Error if i names no device.
int physical_device(int i);
// True when the GPUs of logical devices 0..n-1 can all read each other's memory (peer access:
// NVLink or PCIe), or when they are one GPU; false when one pair cannot. A query, no setup.
bool peer_access_among(int n);
// "NVIDIA H200 (sm_90, 141 GiB)" for (logical) device i; throws dsi::Error if i is not visible.
std::string device_description(int i);
// Free bytes on the GPU of (logical) device i now (cudaMemGetInfo); throws dsi::Error if i is not
// visible.
size_t free_memory(int i);

// The caching allocator of (logical) device i (memory/memory.h): cudaMalloc calls so far, bytes it holds from
// the device, bytes of those in live tensors and scratch.
struct MemoryStats {
  int64_t device_allocations = 0;
  int64_t reserved_bytes = 0;
  int64_t in_use_bytes = 0;
};
MemoryStats memory_stats(int i);
// Returns the cached free blocks of device i to the device (after its stream's work).
void empty_cache(int i);

}  // namespace dsi::cuda
