// smem_limit.h: raising a kernel's dynamic shared-memory limit, once per device and size. Header
// only, with no other dependency, so that the marlin family's standalone build can use it too.
#pragma once

#include <cuda_runtime.h>

namespace qb {

constexpr int kSmemLimitDevices = 64;

// Makes `kernel` launchable with `bytes` of dynamic shared memory on the current device. `allowed`
// is the caller's record for this kernel (one static array per kernel instance) of what each device
// already grants; devices past the array are asked every time. Racing threads only repeat an
// idempotent call.
template <class Kernel>
inline cudaError_t allow_dynamic_smem(Kernel* kernel, int bytes, int (&allowed)[kSmemLimitDevices]) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const bool recorded = dev >= 0 && dev < kSmemLimitDevices;
  if (recorded && allowed[dev] >= bytes) return cudaSuccess;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess && recorded) allowed[dev] = bytes;
  return e;
}

}  // namespace qb
