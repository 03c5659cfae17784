// grouped.h: a grouped scaled_mm request (qb_grouped_scaled_mm) that passed every check of
// grouped_scaled_mm.cu, and the kernel family entry points that take one.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "qb_common.h"

namespace qb {

// The most groups one call may have (checked in grouped_scaled_mm.cu; the sm90 family's argument
// kernel gives each group one thread of one block).
constexpr int64_t kMaxGroups = 1024;

struct GroupedArgs {
  const void* a;             // [M, K] e4m3 row-major, row stride lda
  int64_t lda;
  const void* b;             // [G, K, N] e4m3, group g column-major at b + g * ldb_group, column stride ldb
  int64_t ldb, ldb_group;
  void* out;                 // [M, N] row-major, row stride ldo
  int64_t ldo;
  const int32_t* offsets;    // [G] cumulative row ends, on the device
  int64_t M, N, K, groups;
  int out_dtype;             // QB_BF16 or QB_F16
  bool block_scaled;         // scale_a [M, ceil(K/128)], scale_b [G, ceil(K/128), ceil(N/128)]
  const float* scale_a;      // else [1] or [M] (scale_a_per_row)
  bool scale_a_per_row;
  const float* scale_b;      // else [G] or [G, N] (scale_b_per_col)
  bool scale_b_per_col;
  const void* bias;          // NULL or [G, N] of out_dtype
  void* workspace;           // NULL or workspace_size bytes of device memory (the sm90 family's)
  size_t workspace_size;
  cudaStream_t stream;
  int config;                // -1: automatic
};

// mma.sync e4m3 on sm_89+ (sm89/fp8_grouped_sm89.cu).
int sm89_fp8_grouped_scaled_mm(const GroupedArgs& args, const Err& err);
int sm89_fp8_grouped_config_count();
const char* sm89_fp8_grouped_config_name(int config);

// TMA + WGMMA on sm_90a, every scale kind and bias (sm90/fp8_grouped_sm90_dispatch.cu); its
// workspace is the per-group argument arrays it writes on the device.
int sm90_fp8_grouped_scaled_mm(const GroupedArgs& args, int sm_count, const Err& err);
size_t sm90_fp8_grouped_workspace(const GroupedArgs& args, int sm_count);
int sm90_fp8_grouped_config_count();
const char* sm90_fp8_grouped_config_name(int config);

}  // namespace qb
