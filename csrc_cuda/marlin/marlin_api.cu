// marlin_api.cu: the qb_marlin_* C entry points: argument checks, variant choice, workspace layout.
// Host code only (no kernels), so it can be compiled with any family. Which families exist is told
// by QB_HAS_MARLIN_80 / QB_HAS_MARLIN_75 (qb_declare_variant in marlin.cmake, when that family is built).
#include <cuda_runtime.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>

#include "marlin_internal.h"
#include "qbackend_cuda.h"

namespace qbmarlin {

int set_err(char* err, size_t err_len, int code, const char* fmt, ...) {
  if (err && err_len > 0) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
  }
  return code;
}

namespace {

#if defined(QB_HAS_MARLIN_80)
constexpr bool kHaveSm80 = true;
#else
constexpr bool kHaveSm80 = false;
#endif
#if defined(QB_HAS_MARLIN_75)
constexpr bool kHaveSm75 = true;
#else
constexpr bool kHaveSm75 = false;
#endif

struct DeviceInfo {
  int sm_count, smem_optin, smem_per_sm, cc;  // cc = 10 * major + minor
};

constexpr int kMaxDevices = 64;
DeviceInfo g_info[kMaxDevices];  // zero until first queried (benign races: same values written)

int device_info(DeviceInfo* out, char* err, size_t err_len) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess)
    return set_err(err, err_len, QB_ERR_CUDA, "marlin: cudaGetDevice: %s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
  if (dev >= 0 && dev < kMaxDevices && g_info[dev].sm_count > 0) {
    *out = g_info[dev];
    return QB_OK;
  }
  DeviceInfo d{};
  int major = 0, minor = 0;
  if ((e = cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess ||
      (e = cudaDeviceGetAttribute(&d.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev)) != cudaSuccess ||
      (e = cudaDeviceGetAttribute(&d.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev)) != cudaSuccess ||
      (e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev)) != cudaSuccess ||
      (e = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev)) != cudaSuccess)
    return set_err(err, err_len, QB_ERR_CUDA, "marlin: cudaDeviceGetAttribute: %s: %s", cudaGetErrorName(e),
                   cudaGetErrorString(e));
  d.cc = 10 * major + minor;
  if (d.sm_count < 1) return set_err(err, err_len, QB_ERR_CUDA, "marlin: device reports no multiprocessors");
  if (dev >= 0 && dev < kMaxDevices) g_info[dev] = d;
  *out = d;
  return QB_OK;
}

bool aligned(const void* p, uintptr_t n) { return (reinterpret_cast<uintptr_t>(p) & (n - 1)) == 0; }

constexpr size_t kSlotBytes = sizeof(float) * kPartialFloats;

size_t counter_bytes(int64_t N) {
  const size_t c = sizeof(int) * static_cast<size_t>(cdiv(N, kTileN));
  return (c + kCounterBytesAlign - 1) / kCounterBytesAlign * kCounterBytesAlign;
}

bool sizes_ok(int64_t N, int64_t K) {
  return N >= 1 && K >= 1 && N <= INT_MAX - kTileN && K <= INT_MAX - kTileK && cdiv(N, kTileN) * cdiv(K, kTileK) <= INT_MAX;
}

int64_t units_of(int64_t N, int64_t K) { return cdiv(N, kTileN) * cdiv(K, kTileK); }

// Workspace layout: [partial slots: 2 per block, one block per multiprocessor][tile counters].
// The slot area depends on the device only, so counters always sit at the same offset and one
// workspace can serve every shape in turn (each launch leaves its counters at zero, and partial
// sums never reach the counter area).
size_t partials_bytes(int sm_count) { return 2 * static_cast<size_t>(kMaxBlocksPerSm) * sm_count * kSlotBytes; }

size_t workspace_for(int64_t N, int64_t K, int sm_count) {
  (void)K;
  return partials_bytes(sm_count) + counter_bytes(N);
}

const char* dtype_name(int d) {
  switch (d) {
    case QB_F32: return "fp32";
    case QB_F16: return "fp16";
    case QB_BF16: return "bf16";
    case QB_E4M3: return "e4m3";
    case QB_E5M2: return "e5m2";
    case QB_I8: return "int8";
    case QB_I32: return "int32";
    default: return "unknown";
  }
}

int mm_impl(const void* a, int64_t lda, const void* packed, size_t packed_bytes, void* out, int64_t ldo, int64_t M,
            int64_t N, int64_t K, int act_dtype, const float* w_scale, int scale_kind, const void* bias, void* workspace,
            size_t workspace_bytes, int variant, int stages, int max_blocks, int blocks_per_sm, void* stream, char* err,
            size_t err_len) {
  if (err && err_len) err[0] = '\0';
  const int INV = QB_ERR_INVALID_ARGUMENT;
  if (M < 0) return set_err(err, err_len, INV, "marlin mm: M must be >= 0 (got %lld)", (long long)M);
  if (N < 1 || K < 1) return set_err(err, err_len, INV, "marlin mm: N and K must be >= 1 (got N=%lld, K=%lld)", (long long)N, (long long)K);
  if (!sizes_ok(N, K)) return set_err(err, err_len, INV, "marlin mm: N=%lld, K=%lld too large", (long long)N, (long long)K);
  if (N % 8 != 0) return set_err(err, err_len, INV, "marlin mm: N must be a multiple of 8 (got %lld)", (long long)N);
  if (K % 8 != 0) return set_err(err, err_len, INV, "marlin mm: K must be a multiple of 8 (got %lld)", (long long)K);
  if (act_dtype != QB_F16 && act_dtype != QB_BF16)
    return set_err(err, err_len, INV, "marlin mm: act_dtype must be QB_F16 or QB_BF16 (got %d, %s)", act_dtype, dtype_name(act_dtype));
  if (scale_kind != QB_SCALE_TENSOR && scale_kind != QB_SCALE_ROW)
    return set_err(err, err_len, INV, "marlin mm: scale_kind must be QB_SCALE_TENSOR or QB_SCALE_ROW (got %d)", scale_kind);
  if (variant != QB_VARIANT_AUTO && variant != QB_VARIANT_SM80 && variant != QB_VARIANT_SM75)
    return set_err(err, err_len, INV, "marlin mm: variant must be 0 (auto), 80 or 75 (got %d)", variant);
  if (stages < 0 || stages == 1 || stages > 12)
    return set_err(err, err_len, INV, "marlin mm: stages must be 0 (auto) or 2..12 (got %d)", stages);
  if (max_blocks < 0) return set_err(err, err_len, INV, "marlin mm: max_blocks must be >= 0 (got %d)", max_blocks);
  if (blocks_per_sm < 0 || blocks_per_sm > kMaxBlocksPerSm)
    return set_err(err, err_len, INV, "marlin mm: blocks_per_sm must be 0 (auto), 1 or 2 (got %d)", blocks_per_sm);
  if (M == 0) return QB_OK;  // nothing to read or write: a and out may be NULL
  if (!a) return set_err(err, err_len, INV, "marlin mm: a is NULL");
  if (!packed) return set_err(err, err_len, INV, "marlin mm: packed_w is NULL");
  if (!out) return set_err(err, err_len, INV, "marlin mm: out is NULL");
  if (!w_scale) return set_err(err, err_len, INV, "marlin mm: w_scale is NULL");
  if (!workspace) return set_err(err, err_len, INV, "marlin mm: workspace is NULL (see qb_marlin_workspace_bytes)");
  if (!aligned(a, 16)) return set_err(err, err_len, INV, "marlin mm: a must be 16-byte aligned (address %p)", a);
  if (!aligned(out, 16)) return set_err(err, err_len, INV, "marlin mm: out must be 16-byte aligned (address %p)", out);
  if (!aligned(packed, 16)) return set_err(err, err_len, INV, "marlin mm: packed_w must be 16-byte aligned (address %p)", packed);
  if (!aligned(workspace, 16)) return set_err(err, err_len, INV, "marlin mm: workspace must be 16-byte aligned (address %p)", workspace);
  if (!aligned(w_scale, 4)) return set_err(err, err_len, INV, "marlin mm: w_scale must be 4-byte aligned (address %p)", (const void*)w_scale);
  if (bias && !aligned(bias, 4)) return set_err(err, err_len, INV, "marlin mm: bias must be 4-byte aligned (address %p)", bias);
  if (lda < K) return set_err(err, err_len, INV, "marlin mm: lda (%lld) must be >= K (%lld)", (long long)lda, (long long)K);
  if (ldo < N) return set_err(err, err_len, INV, "marlin mm: ldo (%lld) must be >= N (%lld)", (long long)ldo, (long long)N);
  if (lda % 8 != 0)
    return set_err(err, err_len, INV, "marlin mm: lda must be a multiple of 8 elements (16-byte rows; got %lld)", (long long)lda);
  if (ldo % 8 != 0)
    return set_err(err, err_len, INV, "marlin mm: ldo must be a multiple of 8 elements (16-byte rows; got %lld)", (long long)ldo);
  const size_t need_packed = qb_marlin_packed_bytes(N, K);
  if (packed_bytes < need_packed)
    return set_err(err, err_len, INV, "marlin mm: packed_w holds %zu bytes, (N=%lld, K=%lld) needs %zu (qb_marlin_packed_bytes)",
                   packed_bytes, (long long)N, (long long)K, need_packed);

  DeviceInfo dev;
  int rc = device_info(&dev, err, err_len);
  if (rc != QB_OK) return rc;
  const size_t need_ws = workspace_for(N, K, dev.sm_count);
  if (workspace_bytes < need_ws)
    return set_err(err, err_len, INV, "marlin mm: workspace holds %zu bytes, (N=%lld, K=%lld) needs %zu on this device (qb_marlin_workspace_bytes)",
                   workspace_bytes, (long long)N, (long long)K, need_ws);

  int v = variant;
  if (v == QB_VARIANT_AUTO) {
    if (dev.cc >= 80 && kHaveSm80) v = QB_VARIANT_SM80;
    else if (dev.cc >= 75 && kHaveSm75) v = QB_VARIANT_SM75;
    else if (dev.cc < 75)
      return set_err(err, err_len, QB_ERR_UNSUPPORTED, "marlin mm: needs compute capability >= 7.5 (device has %d.%d)", dev.cc / 10, dev.cc % 10);
    else
      return set_err(err, err_len, QB_ERR_NOT_BUILT, "marlin mm: no marlin kernel for compute capability %d.%d was compiled into this library",
                     dev.cc / 10, dev.cc % 10);
    if (v == QB_VARIANT_SM75 && act_dtype == QB_BF16 && dev.cc >= 80)
      return set_err(err, err_len, QB_ERR_NOT_BUILT, "marlin mm: bf16 needs the sm80 variant, which was not compiled into this library");
  }
  if (v == QB_VARIANT_SM80) {
    if (!kHaveSm80) return set_err(err, err_len, QB_ERR_NOT_BUILT, "marlin mm: the sm80 variant was not compiled into this library");
    if (dev.cc < 80)
      return set_err(err, err_len, QB_ERR_UNSUPPORTED, "marlin mm: the sm80 variant needs compute capability >= 8.0 (device has %d.%d)",
                     dev.cc / 10, dev.cc % 10);
  } else {
    if (!kHaveSm75) return set_err(err, err_len, QB_ERR_NOT_BUILT, "marlin mm: the sm75 variant was not compiled into this library");
    if (dev.cc < 75)
      return set_err(err, err_len, QB_ERR_UNSUPPORTED, "marlin mm: the sm75 variant needs compute capability >= 7.5 (device has %d.%d)",
                     dev.cc / 10, dev.cc % 10);
    if (act_dtype == QB_BF16)
      return set_err(err, err_len, QB_ERR_UNSUPPORTED,
                     "marlin mm: the sm75 variant does not take bf16 activations (sm_75 tensor cores have no bf16 MMA, and "
                     "converting bf16 to fp16 would overflow above 65504); use fp16 activations or the sm80 variant");
  }
  MmArgs args{};
  args.a = a;
  args.lda = lda;
  args.w = static_cast<const uint8_t*>(packed);
  args.out = out;
  args.ldo = ldo;
  args.M = M;
  args.N = static_cast<int>(N);
  args.K = static_cast<int>(K);
  args.bf16 = act_dtype == QB_BF16;
  args.scale = w_scale;
  args.scale_per_col = scale_kind == QB_SCALE_ROW;
  args.bias = bias;
  args.partials = static_cast<float*>(workspace);
  args.counters = reinterpret_cast<int*>(static_cast<uint8_t*>(workspace) + partials_bytes(dev.sm_count));
  args.max_grid = kMaxBlocksPerSm * dev.sm_count;
  if (max_blocks > 0 && max_blocks < args.max_grid) args.max_grid = max_blocks;
  args.sm_count = dev.sm_count;
  args.smem_optin = dev.smem_optin;
  args.smem_per_sm = dev.smem_per_sm;
  args.stages = stages;
  args.blocks_per_sm = blocks_per_sm;
  args.stream = static_cast<cudaStream_t>(stream);
#if defined(QB_HAS_MARLIN_80)
  if (v == QB_VARIANT_SM80) return sm80_marlin_mm(args, err, err_len);
#endif
#if defined(QB_HAS_MARLIN_75)
  if (v == QB_VARIANT_SM75) return sm75_marlin_mm(args, err, err_len);
#endif
  return set_err(err, err_len, QB_ERR_NOT_BUILT, "marlin mm: variant %d was not compiled into this library", v);
}

}  // namespace
}  // namespace qbmarlin

using namespace qbmarlin;

extern "C" {

int qb_marlin_has_variant(int variant) {
  if (variant == QB_VARIANT_SM80) return kHaveSm80 ? 1 : 0;
  if (variant == QB_VARIANT_SM75) return kHaveSm75 ? 1 : 0;
  if (variant == QB_VARIANT_AUTO) return (kHaveSm80 || kHaveSm75) ? 1 : 0;
  return 0;
}

size_t qb_marlin_packed_bytes(int64_t N, int64_t K) {
  if (!sizes_ok(N, K)) return 0;
  return static_cast<size_t>(units_of(N, K)) * kTileBytes;
}

size_t qb_marlin_workspace_bytes(int64_t N, int64_t K) {
  if (!sizes_ok(N, K)) return 0;
  DeviceInfo dev;
  if (device_info(&dev, nullptr, 0) != QB_OK) return 0;
  return workspace_for(N, K, dev.sm_count);
}

int qb_marlin_prepare(const void* w, int64_t ldw, int64_t N, int64_t K, int act_dtype, void* packed,
                      size_t packed_bytes, int32_t* nan_count, void* stream, char* err, size_t err_len) {
  if (err && err_len) err[0] = '\0';
  const int INV = QB_ERR_INVALID_ARGUMENT;
  if (act_dtype != QB_F16 && act_dtype != QB_BF16)
    return set_err(err, err_len, INV, "marlin prepare: act_dtype must be QB_F16 or QB_BF16 (got %d)", act_dtype);
  const bool bf16 = act_dtype == QB_BF16;
  if (N < 1 || K < 1) return set_err(err, err_len, INV, "marlin prepare: N and K must be >= 1 (got N=%lld, K=%lld)", (long long)N, (long long)K);
  if (!sizes_ok(N, K)) return set_err(err, err_len, INV, "marlin prepare: N=%lld, K=%lld too large", (long long)N, (long long)K);
  if (!w) return set_err(err, err_len, INV, "marlin prepare: w is NULL");
  if (!packed) return set_err(err, err_len, INV, "marlin prepare: packed is NULL");
  if (ldw < K) return set_err(err, err_len, INV, "marlin prepare: ldw (%lld) must be >= K (%lld)", (long long)ldw, (long long)K);
  if (!aligned(packed, 16)) return set_err(err, err_len, INV, "marlin prepare: packed must be 16-byte aligned (address %p)", packed);
  if (nan_count && !aligned(nan_count, 4)) return set_err(err, err_len, INV, "marlin prepare: nan_count must be 4-byte aligned");
  const size_t need = qb_marlin_packed_bytes(N, K);
  if (packed_bytes < need)
    return set_err(err, err_len, INV, "marlin prepare: packed holds %zu bytes, (N=%lld, K=%lld) needs %zu (qb_marlin_packed_bytes)",
                   packed_bytes, (long long)N, (long long)K, need);
  cudaStream_t s = static_cast<cudaStream_t>(stream);
#if defined(QB_HAS_MARLIN_80)
  {
    DeviceInfo dev;
    const int rc = device_info(&dev, err, err_len);
    if (rc != QB_OK) return rc;
    if (dev.cc >= 80 || !kHaveSm75)
      return sm80_marlin_prepare(w, ldw, static_cast<int>(N), static_cast<int>(K), bf16, packed, nan_count, s, err,
                                 err_len);
  }
#endif
#if defined(QB_HAS_MARLIN_75)
  return sm75_marlin_prepare(w, ldw, static_cast<int>(N), static_cast<int>(K), bf16, packed, nan_count, s, err,
                             err_len);
#else
  (void)s;
  (void)bf16;
  return set_err(err, err_len, QB_ERR_NOT_BUILT, "marlin prepare: no marlin kernels were compiled into this library");
#endif
}

int qb_marlin_unpack(const void* packed_w, size_t packed_bytes, int64_t N, int64_t K, int act_dtype, const float* w_scale,
                     int scale_kind, void* out, int64_t ldo, void* stream, char* err, size_t err_len) {
  if (err && err_len) err[0] = '\0';
  const int INV = QB_ERR_INVALID_ARGUMENT;
  if (act_dtype != QB_F16 && act_dtype != QB_BF16)
    return set_err(err, err_len, INV, "marlin unpack: act_dtype must be QB_F16 or QB_BF16 (got %d)", act_dtype);
  if (N < 1 || K < 1 || K % 16)
    return set_err(err, err_len, INV, "marlin unpack: N >= 1 and K a positive multiple of 16 (got N=%lld, K=%lld)",
                   (long long)N, (long long)K);
  if (!sizes_ok(N, K)) return set_err(err, err_len, INV, "marlin unpack: N=%lld, K=%lld too large", (long long)N, (long long)K);
  if (!packed_w || !out || !w_scale) return set_err(err, err_len, INV, "marlin unpack: packed_w, w_scale and out must be non-NULL");
  if (scale_kind != QB_SCALE_TENSOR && scale_kind != QB_SCALE_ROW)
    return set_err(err, err_len, INV, "marlin unpack: scale_kind must be QB_SCALE_TENSOR or QB_SCALE_ROW (got %d)", scale_kind);
  if (ldo < K || ldo % 2) return set_err(err, err_len, INV, "marlin unpack: ldo (%lld) must be even and >= K (%lld)", (long long)ldo, (long long)K);
  if (!aligned(out, 4) || !aligned(packed_w, 16))
    return set_err(err, err_len, INV, "marlin unpack: out must be 4-byte and packed_w 16-byte aligned");
  const size_t need = qb_marlin_packed_bytes(N, K);
  if (packed_bytes < need)
    return set_err(err, err_len, INV, "marlin unpack: packed_w holds %zu bytes, (N=%lld, K=%lld) needs %zu", packed_bytes,
                   (long long)N, (long long)K, need);
#if defined(QB_HAS_MARLIN_80)
  DeviceInfo dev;
  const int rc = device_info(&dev, err, err_len);
  if (rc != QB_OK) return rc;
  if (dev.cc < 80) return set_err(err, err_len, QB_ERR_UNSUPPORTED, "marlin unpack: needs sm_80 or newer (device is sm_%d)", dev.cc);
  return sm80_marlin_unpack(packed_w, static_cast<int>(N), static_cast<int>(K), act_dtype == QB_BF16, w_scale,
                            scale_kind == QB_SCALE_ROW, out, ldo, static_cast<cudaStream_t>(stream), err, err_len);
#else
  (void)stream;
  return set_err(err, err_len, QB_ERR_NOT_BUILT, "marlin unpack: the sm_80 marlin kernels were not compiled into this library");
#endif
}

int qb_marlin_mm(const void* a, int64_t lda, const void* packed_w, size_t packed_bytes, void* out, int64_t ldo, int64_t M,
                 int64_t N, int64_t K, int act_dtype, const float* w_scale, int scale_kind, const void* bias, void* workspace,
                 size_t workspace_bytes, int variant, void* stream, char* err, size_t err_len) {
  return mm_impl(a, lda, packed_w, packed_bytes, out, ldo, M, N, K, act_dtype, w_scale, scale_kind, bias, workspace,
                 workspace_bytes, variant, 0, 0, 0, stream, err, err_len);
}

int qb_marlin_mm_tuned(const void* a, int64_t lda, const void* packed_w, size_t packed_bytes, void* out, int64_t ldo,
                       int64_t M, int64_t N, int64_t K, int act_dtype, const float* w_scale, int scale_kind,
                       const void* bias, void* workspace, size_t workspace_bytes, int variant, int stages, int max_blocks,
                       int blocks_per_sm, void* stream, char* err, size_t err_len) {
  return mm_impl(a, lda, packed_w, packed_bytes, out, ldo, M, N, K, act_dtype, w_scale, scale_kind, bias, workspace,
                 workspace_bytes, variant, stages, max_blocks, blocks_per_sm, stream, err, err_len);
}

}  // extern "C"
