// smem_limit.h: raising a kernel's dynamic shared-memory limit, once per device and size. Header
// only, with no other dependency, so that the marlin family's standalone build can use it too.
#pragma once

#include <cuda_runtime.h>

#include <mutex>

namespace qb {

constexpr int kSmemLimitDevices = 64;

// Serializes every check-and-raise below. Without it two threads asking for different sizes could
// interleave so that the smaller limit is set last while the larger is recorded, and a launch with
// the larger size would fail. Taken only until a device's record covers the size asked for.
inline std::mutex& smem_limit_mutex() {
  static std::mutex m;
  return m;
}

// Makes `kernel` launchable with `bytes` of dynamic shared memory on the current device. `allowed`
// is the caller's record for this kernel (one static array per kernel instance) of what each device
// already grants; the limit only ever grows. Devices past the array are asked every time (under
// the mutex, raising the limit to at least `bytes`; a concurrent smaller request on such a device
// could lower it again, which no machine with 64 or fewer GPUs meets).
template <class Kernel>
inline cudaError_t allow_dynamic_smem(Kernel* kernel, int bytes, int (&allowed)[kSmemLimitDevices]) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const bool recorded = dev >= 0 && dev < kSmemLimitDevices;
  std::lock_guard<std::mutex> lock(smem_limit_mutex());
  if (recorded && allowed[dev] >= bytes) return cudaSuccess;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess && recorded) allowed[dev] = bytes;
  return e;
}

}  // namespace qb
