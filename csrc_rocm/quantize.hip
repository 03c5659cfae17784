// quantize.hip: qb_quantize, qb_quantize_group and qb_quantize_workspace_size: argument checks, the
// choice of kernel and its shape, the launches. The kernels are in quantize_kernels.h.
//
// Modes (the same as libqbackend_cuda's):
//   STATIC_TENSOR  one elementwise pass.
//   DYNAMIC_TOKEN  one fused pass: a block owns a row, keeps it in registers while it reduces the
//                  row's amax, then scales and stores it.
//   DYNAMIC_GROUP  one fused pass: a few lanes of a wavefront own a group.
//   DYNAMIC_TENSOR memset(accumulator) -> amax pass (atomicMax) -> convert pass. The accumulator is
//                  the caller's workspace, or, without one, `scale` itself followed by a one-thread
//                  pass that turns the amax into the scale. No host sync, no allocation.
// Block shapes are reasoned, not tuned: no AMD GPU has run this code yet (csrc_rocm/README.md).
#include <stdarg.h>
#include <stdio.h>

#include "quantize_kernels.h"

namespace {

using qbr::Bf16;
using qbr::F16;

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The message of a failed call, written into the caller's buffer.
struct Err {
  char* buf;
  size_t len;
  int set(int code, const char* fmt, ...) const {
    if (buf != nullptr && len > 0) {
      va_list ap;
      va_start(ap, fmt);
      vsnprintf(buf, len, fmt, ap);
      va_end(ap);
    }
    return code;
  }
  int hip(hipError_t e, const char* what) const {
    return set(QB_ERR_RUNTIME, "%s: %s (hipError_t %d)", what, hipGetErrorString(e), static_cast<int>(e));
  }
};

struct QuantArgs {
  const void* x;
  int64_t ldx;
  uint8_t* q;
  int64_t ldq;
  float* scale;
  int64_t rows, cols;
  int mode;
  int64_t group, ld_scale;  // DYNAMIC_GROUP only
  const float* scale_ub;
  void* workspace;
  hipStream_t stream;
};

unsigned grid_of(int64_t blocks) { return static_cast<unsigned>(blocks < qbr::kMaxGrid ? blocks : qbr::kMaxGrid); }

// Threads of the per-token block for rows of nvec vectors: about two vectors each (the register
// cache holds qbr::kCacheVecs), a whole number of wavefronts, at most qbr::kMaxThreads.
int token_threads(int64_t nvec) {
  const int64_t waves = cdiv(cdiv(nvec, 2), qbr::kWave);
  const int64_t threads = waves * qbr::kWave;
  return static_cast<int>(threads < qbr::kWave ? qbr::kWave : threads > qbr::kMaxThreads ? qbr::kMaxThreads : threads);
}

// Lanes per group: as few as hold the group in qbr::kCacheVecs vectors each, 4 to 64 (a power of two).
int group_lanes(int64_t group_vecs) {
  int lanes = 4;
  while (lanes < qbr::kWave && int64_t(lanes) * qbr::kCacheVecs < group_vecs) lanes *= 2;
  return lanes;
}

// The elementwise pass of STATIC_TENSOR and DYNAMIC_TENSOR (one launch site per kernel: each one
// is a large instantiation under HIP-CPU).
template <typename T, int VEC>
void launch_elementwise(const QuantArgs& a, int qd, unsigned grid, const float* scale_in, const uint32_t* amax_bits,
                        float* scale_out) {
  auto kernel = qbr::elementwise_kernel<T, VEC>;
  hipLaunchKernelGGL(kernel, dim3(grid), dim3(qbr::kThreads), 0, a.stream, static_cast<const T*>(a.x), a.ldx, a.q,
                     a.ldq, a.rows, a.cols / VEC, scale_in, amax_bits, a.scale_ub, scale_out, qd);
}

template <typename T, int VEC>
int launch(const QuantArgs& a, int qd, const Err& err) {
  const int64_t nvec = a.cols / VEC;
  const T* x = static_cast<const T*>(a.x);
  const int64_t tile_vecs = int64_t(qbr::kThreads) * qbr::kTileVecs;
  const unsigned grid_tiles = grid_of(a.rows * cdiv(nvec, tile_vecs));

  if (a.mode == QB_QUANT_DYNAMIC_GROUP) {
    const int lanes = group_lanes(cdiv(a.group, VEC));
    const int64_t groups = a.rows * cdiv(a.cols, a.group);
    auto kernel = qbr::per_group_kernel<T, VEC>;
    hipLaunchKernelGGL(kernel, dim3(grid_of(cdiv(groups, qbr::kThreads / lanes))), dim3(qbr::kThreads), 0, a.stream,
                       x, a.ldx, a.q, a.ldq, a.scale, a.ld_scale, a.rows, a.cols, a.group, lanes, qd);
  } else if (a.mode == QB_QUANT_DYNAMIC_TOKEN) {
    auto kernel = qbr::per_token_kernel<T, VEC>;
    hipLaunchKernelGGL(kernel, dim3(grid_of(a.rows)), dim3(token_threads(nvec)), 0, a.stream, x, a.ldx, a.q, a.ldq,
                       a.scale, a.rows, nvec, a.scale_ub, qd);
  } else if (a.mode == QB_QUANT_STATIC_TENSOR) {
    launch_elementwise<T, VEC>(a, qd, grid_tiles, a.scale, nullptr, nullptr);
  } else {
    uint32_t* acc = static_cast<uint32_t*>(a.workspace ? a.workspace : static_cast<void*>(a.scale));
    hipError_t e = hipMemsetAsync(acc, 0, sizeof(uint32_t), a.stream);
    if (e != hipSuccess) return err.hip(e, "qb_quantize: hipMemsetAsync");
    auto amax = qbr::amax_kernel<T, VEC>;
    hipLaunchKernelGGL(amax, dim3(grid_tiles), dim3(qbr::kThreads), 0, a.stream, x, a.ldx, a.rows, nvec, acc);
    launch_elementwise<T, VEC>(a, qd, grid_tiles, nullptr, acc, a.workspace ? a.scale : nullptr);
    if (!a.workspace) {
      auto finalize = qbr::finalize_scale_kernel;
      hipLaunchKernelGGL(finalize, dim3(1), dim3(1), 0, a.stream, a.scale, a.scale_ub, qd);
    }
  }
  const hipError_t e = hipGetLastError();
  if (e != hipSuccess) return err.hip(e, "qb_quantize: kernel launch");
  return QB_OK;
}

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// 16-byte loads when every row start of x is 16-byte aligned and every row start of q is aligned to
// the VEC output bytes (and, per group, VEC divides the group); one element at a time otherwise.
template <typename T>
int dispatch_vec(const QuantArgs& a, int qd, const Err& err) {
  constexpr int VEC = 16 / sizeof(T);
  const bool vec_ok = aligned(a.x, 16) && (a.ldx * int64_t(sizeof(T))) % 16 == 0 && a.cols % VEC == 0 &&
                      aligned(a.q, VEC) && a.ldq % VEC == 0 &&
                      (a.mode != QB_QUANT_DYNAMIC_GROUP || a.group % VEC == 0);
  return vec_ok ? launch<T, VEC>(a, qd, err) : launch<T, 1>(a, qd, err);
}

// The checks and the dispatch both entry points share; `fn` names the entry point in messages.
int checked_quantize(const QuantArgs& a, int x_dtype, int q_dtype, const char* fn, const Err& err) {
  if (x_dtype != QB_F32 && x_dtype != QB_F16 && x_dtype != QB_BF16)
    return err.set(QB_ERR_INVALID_ARGUMENT, "%s: x_dtype %d must be f32 (0), f16 (1) or bf16 (2)", fn, x_dtype);
  if (q_dtype != QB_E4M3 && q_dtype != QB_E5M2 && q_dtype != QB_I8 && q_dtype != QB_E4M3FNUZ &&
      q_dtype != QB_E5M2FNUZ)
    return err.set(QB_ERR_INVALID_ARGUMENT,
                   "%s: q_dtype %d must be e4m3 (3), e5m2 (4), i8 (5), e4m3fnuz (7) or e5m2fnuz (8)", fn, q_dtype);
  if (a.rows < 0 || a.cols <= 0)
    return err.set(QB_ERR_INVALID_ARGUMENT, "%s: rows (=%lld) must be >= 0 and cols (=%lld) > 0", fn,
                   (long long)a.rows, (long long)a.cols);
  if (a.rows == 0) return QB_OK;
  if (a.x == nullptr || a.q == nullptr || a.scale == nullptr)
    return err.set(QB_ERR_INVALID_ARGUMENT, "%s: x, q and scale must be non-NULL", fn);
  if (a.ldx < a.cols || a.ldq < a.cols)
    return err.set(QB_ERR_INVALID_ARGUMENT, "%s: ldx (=%lld) and ldq (=%lld) must be >= cols (=%lld)", fn,
                   (long long)a.ldx, (long long)a.ldq, (long long)a.cols);
  const size_t xsize = x_dtype == QB_F32 ? 4 : 2;
  if (!aligned(a.x, xsize))
    return err.set(QB_ERR_INVALID_ARGUMENT, "%s: x must be aligned to its element size (%zu bytes)", fn, xsize);
  if (!aligned(a.scale, 4) || (a.scale_ub && !aligned(a.scale_ub, 4)))
    return err.set(QB_ERR_INVALID_ARGUMENT, "%s: scale and scale_ub must be 4-byte aligned fp32", fn);
  if (a.workspace && !aligned(a.workspace, 4))
    return err.set(QB_ERR_INVALID_ARGUMENT, "%s: workspace must be 4-byte aligned", fn);
  switch (x_dtype) {
    case QB_F32: return dispatch_vec<float>(a, q_dtype, err);
    case QB_F16: return dispatch_vec<F16>(a, q_dtype, err);
    default: return dispatch_vec<Bf16>(a, q_dtype, err);
  }
}

}  // namespace

extern "C" size_t qb_quantize_workspace_size(int64_t rows, int64_t cols, int mode) {
  (void)rows;
  (void)cols;
  return mode == QB_QUANT_DYNAMIC_TENSOR ? 16 : 0;  // one fp32 amax, padded to an aligned 16 bytes
}

extern "C" int qb_quantize(const void* x, int64_t ldx, void* q, int64_t ldq, float* scale, int64_t rows, int64_t cols,
                           int x_dtype, int q_dtype, int mode, const float* scale_ub, void* workspace, void* stream,
                           char* err_buf, size_t err_len) {
  const Err err{err_buf, err_len};
  if (err_buf && err_len) err_buf[0] = '\0';
  if (mode != QB_QUANT_STATIC_TENSOR && mode != QB_QUANT_DYNAMIC_TENSOR && mode != QB_QUANT_DYNAMIC_TOKEN)
    return err.set(QB_ERR_INVALID_ARGUMENT, "qb_quantize: mode %d must be 0 (static tensor), 1 (dynamic tensor) or 2 "
                   "(dynamic token); per-group quantize is qb_quantize_group", mode);
  const QuantArgs a{x, ldx, static_cast<uint8_t*>(q), ldq, scale, rows, cols, mode, 0, 0,
                    mode == QB_QUANT_STATIC_TENSOR ? nullptr : scale_ub,
                    mode == QB_QUANT_DYNAMIC_TENSOR ? workspace : nullptr, static_cast<hipStream_t>(stream)};
  return checked_quantize(a, x_dtype, q_dtype, "qb_quantize", err);
}

extern "C" int qb_quantize_group(const void* x, int64_t ldx, void* q, int64_t ldq, float* scale, int64_t ld_scale,
                                 int64_t rows, int64_t cols, int64_t group, int x_dtype, int q_dtype, void* stream,
                                 char* err_buf, size_t err_len) {
  const Err err{err_buf, err_len};
  if (err_buf && err_len) err_buf[0] = '\0';
  if (group <= 0 || group > (int64_t(1) << 30))
    return err.set(QB_ERR_INVALID_ARGUMENT, "qb_quantize_group: group (=%lld) must be in [1, 2^30]", (long long)group);
  if (cols > 0 && ld_scale < cdiv(cols, group))
    return err.set(QB_ERR_INVALID_ARGUMENT, "qb_quantize_group: ld_scale (=%lld) must be >= ceil(cols / group) (=%lld)",
                   (long long)ld_scale, (long long)cdiv(cols, group));
  const QuantArgs a{x, ldx, static_cast<uint8_t*>(q), ldq, scale, rows, cols, QB_QUANT_DYNAMIC_GROUP, group, ld_scale,
                    nullptr, nullptr, static_cast<hipStream_t>(stream)};
  return checked_quantize(a, x_dtype, q_dtype, "qb_quantize_group", err);
}
