// int8_sm90_configs.h: the SM90 INT8 kernel configurations, listed once.
//
// The same CUTLASS 3.x template as the FP8 configs (w8a8_sm90_kernel.cuh) with s8 WGMMA and int32
// accumulation. A K tile of 128 int8 values is as many bytes as one of 128 e4m3 values, and the
// s8 and e4m3 WGMMA rates are the same, so the tiles are the FP8 family's main ones; the FP8
// family's extra wave-fit and small-M kernels are not repeated here (each line costs two kernels of
// compile time).
#pragma once

#include "fp8_sm90_configs.h"  // ConfigInfo, RunOpts, Decomp, QB_SM90_CONFIG_INFO

// X(id, name, swap, tile_m, tile_n, tile_k, cluster_m, cluster_n, schedule): as QB_SM90_FP8_CONFIGS.
#define QB_SM90_INT8_CONFIGS(X)                                                             \
  X(kI8Swap64x16Ping, "i8_swap_64x16x128_ping", true, 64, 16, 128, 1, 1, Ping)              \
  X(kI8Swap64x64Ping, "i8_swap_64x64x128_ping", true, 64, 64, 128, 1, 1, Ping)              \
  X(kI8Swap64x128Ping, "i8_swap_64x128x128_ping", true, 64, 128, 128, 1, 1, Ping)           \
  X(kI8Swap128x64Coop, "i8_swap_128x64x128_coop", true, 128, 64, 128, 1, 1, Coop)           \
  X(kI8Ping128x128Cluster2, "i8_128x128x128_ping_c2x1", false, 128, 128, 128, 2, 1, Ping)

namespace qb::sm90 {

#define QB_INT8_ENUM(id, ...) id,
enum Int8ConfigId : int { QB_SM90_INT8_CONFIGS(QB_INT8_ENUM) kNumInt8Configs };
#undef QB_INT8_ENUM

constexpr ConfigInfo kInt8Configs[kNumInt8Configs] = {QB_SM90_INT8_CONFIGS(QB_SM90_CONFIG_INFO)};

// Defined (explicitly instantiated) in int8_sm90_inst_*.cu. OutTag: 0 bf16, 1 fp16.
template <int Id, int OutTag>
int int8_run_config(const ScaledMmArgs& args, const RunOpts& opts, const Err& err);
template <int Id, int OutTag>
size_t int8_config_workspace(const ScaledMmArgs& args, const RunOpts& opts);

}  // namespace qb::sm90
