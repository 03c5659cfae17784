// qb_common.h: what every translation unit of libqbackend_cuda shares (internal, not part of the ABI).
//
// - Err: writes a status and a formatted message into the caller's buffer (the ABI's err/err_len).
// - device_sm_count(): per-device multiprocessor count, cached so no call after the first queries
//   device properties (cudaGetDevice only: no context is created beyond what launches need).
// - cdiv(): ceiling division for tile and block counts.
// - ScaledMmArgs: one already-validated scaled_mm request, handed from the dispatcher to a family.
// - the family entry points, each compiled only when its arch is in QB_CUDA_ARCHS.
#pragma once

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "qbackend_cuda.h"

namespace qb {

// Error sink for one ABI call. set() returns the code so call sites can `return err.set(...)`.
struct Err {
  char* buf;
  size_t len;
  int set(int code, const char* fmt, ...) const
#if defined(__GNUC__)
      __attribute__((format(printf, 3, 4)))
#endif
      ;
  // For a failed CUDA runtime call: QB_ERR_CUDA with "<what>: <cuda error name>: <string>".
  int cuda(cudaError_t e, const char* what) const;
};

// Facts about the calling thread's current device, read once per device and cached.
struct DeviceInfo {
  int device;
  int sm_count;
  int cc;  // compute capability as major * 10 + minor (90 for H100/H200)
};
// Returns QB_OK or QB_ERR_CUDA (err filled).
int current_device(DeviceInfo* info, const Err& err);

// Ceiling of a / b for positive sizes: tile and block counts.
constexpr int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Whether kernels that support it are launched as programmatic dependents of the kernel before them
// (qb_set_programmatic_launch; on by default). Only sm_90+ kernels act on it.
bool programmatic_launch();

// A scaled_mm request that passed every check of qb_scaled_mm; families may assume them.
struct ScaledMmArgs {
  const void* a;  // [M, K] row-major, row stride lda (elements)
  int64_t lda;
  const void* b;  // [K, N] column-major, column stride ldb (elements): the [N, K] weight, row-major
  int64_t ldb;
  void* out;  // [M, N] row-major, row stride ldo
  int64_t ldo;
  int64_t M, N, K;
  int a_dtype;             // QB_E4M3, QB_I8, or QB_BF16 / QB_F16 (W8A16)
  int out_dtype;           // QB_BF16 or QB_F16
  bool block_scaled;       // QB_SCALE_BLOCK: scale_a [M, ceil(K/128)], scale_b [ceil(K/128), ceil(N/128)]
  bool precise;            // QB_ACCUMULATE_PRECISE: e4m3 partial sums promoted into fp32 (the plain family)
  const float* scale_a;    // [1] or [M]; NULL for W8A16 (16-bit a)
  bool scale_a_per_row;    // true: [M]
  const float* scale_b;    // [1] or [N]
  bool scale_b_per_col;    // true: [N]
  const void* bias;        // NULL or [N] of out_dtype
  void* workspace;         // NULL or workspace_size bytes of device memory
  size_t workspace_size;
  cudaStream_t stream;
  int sm_count;            // of the current device
  // Tuning/test overrides (qb_scaled_mm_override); -1 everywhere means automatic.
  int config;              // family config index
  int decomp;              // 0 data-parallel, 1 split-K, 2 stream-K, 3 CUTLASS heuristic (stream-K kernels)
  int splits;              // split-K factor when decomp == 1
  int swizzle;             // tile swizzle (1, 2, 4, 8) for SM90 configs
  bool programmatic;       // may launch as a programmatic dependent of the previous kernel (SM90)
};

// Family entry points. Each returns a qb_status and fills err. `*_workspace` gives the bytes the
// automatic (or forced) config wants for this problem; 0 when it needs none. When the caller passes
// less workspace than that, the family falls back to a plan needing none (never fails for it).
// config_name returns NULL past the last config.
int sm90_fp8_scaled_mm(const ScaledMmArgs& args, const Err& err);
size_t sm90_fp8_workspace(const ScaledMmArgs& args);
int sm90_fp8_config_count();
const char* sm90_fp8_config_name(int config);
// The automatic choice for a problem (args.M, N, K, sm_count; no pointers read, no GPU needed): the
// config id and, for the stream-K capable configs, the decomposition, split count and swizzle.
int sm90_fp8_auto_config(const ScaledMmArgs& args, int* decomposition, int* splits, int* swizzle);
// Token rows to run the GEMM on when A and scale_a have storage for `available` rows (args.N == 0:
// rows to give an activation buffer); see qb_scaled_mm_token_rows. No GPU needed.
int64_t sm90_fp8_token_rows(const ScaledMmArgs& args, int64_t available);

// W8A16 on sm_90a: a is bf16/fp16, b e4m3, scale_a unused (NULL), out in a's dtype (out_dtype).
int sm90_w8a16_scaled_mm(const ScaledMmArgs& args, const Err& err);
size_t sm90_w8a16_workspace(const ScaledMmArgs& args);
int sm90_w8a16_config_count();
const char* sm90_w8a16_config_name(int config);

// Block-scaled FP8 on sm_90a (args.block_scaled).
int sm90_fp8_block_scaled_mm(const ScaledMmArgs& args, const Err& err);
size_t sm90_fp8_block_workspace(const ScaledMmArgs& args);
int sm90_fp8_block_config_count();
const char* sm90_fp8_block_config_name(int config);

// INT8 (s8 WGMMA) and precise-accumulation FP8 (args.precise) on sm_90a: CUTLASS's plain mainloops.
int sm90_plain_scaled_mm(const ScaledMmArgs& args, const Err& err);
size_t sm90_plain_workspace(const ScaledMmArgs& args);
int sm90_plain_config_count();
const char* sm90_plain_config_name(int config);

int sm89_fp8_scaled_mm(const ScaledMmArgs& args, const Err& err);
size_t sm89_fp8_workspace(const ScaledMmArgs& args);
int sm89_fp8_config_count();
const char* sm89_fp8_config_name(int config);
// Block-scaled e4m3 on sm_89 (mma.sync, hand-written; the same scale layouts as the sm90 family).
int sm89_fp8_block_scaled_mm(const ScaledMmArgs& args, const Err& err);
size_t sm89_fp8_block_workspace(const ScaledMmArgs& args);
int sm89_fp8_block_config_count();
const char* sm89_fp8_block_config_name(int config);

int sm80_int8_scaled_mm(const ScaledMmArgs& args, const Err& err);
size_t sm80_int8_workspace(const ScaledMmArgs& args);
int sm80_int8_config_count();
const char* sm80_int8_config_name(int config);

int sm75_int8_scaled_mm(const ScaledMmArgs& args, const Err& err);
size_t sm75_int8_workspace(const ScaledMmArgs& args);
int sm75_int8_config_count();
const char* sm75_int8_config_name(int config);

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace qb
