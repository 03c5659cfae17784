// runtime.cu: error messages, the per-device property cache and the programmatic-launch switch, shared
// by every entry point.
#include <stdarg.h>
#include <stdio.h>

#include <atomic>

#include "qb_common.h"

namespace qb {

int Err::set(int code, const char* fmt, ...) const {
  if (buf != nullptr && len > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, len, fmt, ap);  // always NUL-terminates when len > 0
    va_end(ap);
  }
  return code;
}

int Err::cuda(cudaError_t e, const char* what) const {
  return set(QB_ERR_CUDA, "%s: %s: %s", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

namespace {
// Enough for any machine today; devices past it are queried on every call (correct, slower).
constexpr int kMaxDevices = 64;
// 0 = not cached yet; else (sm_count << 16) | cc. Racing first calls both write the same value.
std::atomic<int> g_device_cache[kMaxDevices];
}  // namespace

int current_device(DeviceInfo* info, const Err& err) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return err.cuda(e, "cudaGetDevice");
  info->device = dev;
  if (dev >= 0 && dev < kMaxDevices) {
    const int v = g_device_cache[dev].load(std::memory_order_relaxed);
    if (v != 0) {
      info->sm_count = v >> 16;
      info->cc = v & 0xffff;
      return QB_OK;
    }
  }
  // Attribute queries are cheaper than cudaGetDeviceProperties and need no context of their own.
  int sms = 0, major = 0, minor = 0;
  if ((e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess ||
      (e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev)) != cudaSuccess ||
      (e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev)) != cudaSuccess)
    return err.cuda(e, "cudaDeviceGetAttribute");
  info->sm_count = sms;
  info->cc = major * 10 + minor;
  if (dev >= 0 && dev < kMaxDevices) g_device_cache[dev].store((sms << 16) | info->cc, std::memory_order_relaxed);
  return QB_OK;
}

namespace {
std::atomic<bool> g_programmatic{true};
}  // namespace

bool programmatic_launch() { return g_programmatic.load(std::memory_order_relaxed); }

}  // namespace qb

extern "C" void qb_set_programmatic_launch(int enabled) { qb::g_programmatic = enabled != 0; }
