// hip_cpu_stream.cpp: compiled only into the HIP-CPU build of this library (the tests' build), where
// kernels run on the CPU runtime's worker threads, over host memory.
//
// qb_hip_cpu_stream: the stream the binding (providers/rocm_native.py) launches on. Not the null
// stream: HIP-CPU's scheduler can drain the null stream from two threads at once, so a kernel may
// start before the one queued ahead of it has finished (the per-tensor passes then read a partial
// amax); a stream of its own runs its work in order.
// qb_hip_cpu_synchronize: the binding calls it at the end of every call, so that a call returns when
// its kernels are done, as a CPU op does (the caller may free a temporary right after).
// The GPU library has neither: there, torch's current stream orders the work, and torch's
// stream-ordered allocator keeps memory alive for the kernels queued on it.
#include <hip/hip_runtime.h>

extern "C" void* qb_hip_cpu_stream(void) {
  static hipStream_t stream = [] {
    hipStream_t s = nullptr;
    return hipStreamCreate(&s) == hipSuccess ? s : nullptr;
  }();
  return stream;
}

extern "C" int qb_hip_cpu_synchronize(void) {
  return static_cast<int>(hipStreamSynchronize(static_cast<hipStream_t>(qb_hip_cpu_stream())));
}
