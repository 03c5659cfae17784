// marlin_internal.h: what the marlin dispatcher (marlin_api.cu) and the two family translation units
// (marlin_sm80.cu, marlin_sm75.cu) share. Internal; not part of the ABI.
#pragma once

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

namespace qbmarlin {

constexpr int kThreads = 256;           // 8 warps: 2 along n (64 columns each) x 4 along k
constexpr int kTileN = 128;             // weight tile rows (output columns) per unit of work
constexpr int kTileK = 128;             // weight tile columns (reduction depth) per unit of work
constexpr int kTileBytes = kTileN * kTileK;  // one fp8 byte per weight: 16 KiB
constexpr int kMaxRows = 64;            // activation rows per launch (4 m16 tiles)
constexpr int kPartialFloats = kMaxRows * kTileN;  // one split-K partial slot
constexpr int kMaxBlocksPerSm = 2;                  // the workspace has partial slots for this many
constexpr size_t kCounterBytesAlign = 256;

inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// One validated request, handed from the dispatcher to a family.
struct MmArgs {
  const void* a;
  int64_t lda;
  const uint8_t* w;  // packed
  void* out;
  int64_t ldo;
  int64_t M;
  int N, K;
  bool bf16;
  const float* scale;
  bool scale_per_col;
  const void* bias;
  int* counters;      // [ceil(N/128)] zeroed ints (workspace head)
  float* partials;    // [2 * max_grid][64 * 128] (workspace tail)
  int max_grid;       // blocks per launch the workspace has room for
  int sm_count;
  int smem_optin;     // bytes of dynamic shared memory one block may opt into
  int smem_per_sm;    // bytes of shared memory per multiprocessor
  int stages;         // 0: automatic
  int blocks_per_sm;  // 0: automatic (2 where the kernel is built for it and it fits), else 1 or 2
  cudaStream_t stream;
};

// Family entry points. Return a qb_status and write a message into err on failure.
int sm80_marlin_mm(const MmArgs& args, char* err, size_t err_len);
int sm80_marlin_prepare(const void* w, int64_t ldw, int N, int K, bool bf16, void* packed, int32_t* nan_count,
                        cudaStream_t stream, char* err, size_t err_len);
// The packed weight back to [N, K] in the activation dtype, scaled (marlin_unpack.cu, SM80 family).
int sm80_marlin_unpack(const void* packed, int N, int K, bool bf16, const float* scale, bool scale_per_col, void* out,
                       int64_t ldo, cudaStream_t stream, char* err, size_t err_len);
int sm75_marlin_mm(const MmArgs& args, char* err, size_t err_len);
int sm75_marlin_prepare(const void* w, int64_t ldw, int N, int K, bool bf16, void* packed, int32_t* nan_count,
                        cudaStream_t stream, char* err, size_t err_len);

// Formats a message into err (NUL-terminated, truncated to err_len) and returns code. Defined in
// marlin_api.cu, which is always part of the library.
int set_err(char* err, size_t err_len, int code, const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

}  // namespace qbmarlin
