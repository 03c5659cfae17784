// plain_sm90_configs.h: the configurations of the SM90 kernels on CUTLASS's plain (not fast-
// accumulation) mainloops, listed once: INT8 (s8 WGMMA, exact int32 accumulation) and precise FP8
// (e4m3 WGMMA whose partial sums are promoted into fp32 registers after every 128-deep K tile, the
// accumulate="precise" mode). Both come from the FP8 family's template (w8a8_sm90_kernel.cuh).
//
// A K tile of 128 int8 values is as many bytes as one of 128 e4m3 values, and the s8 and e4m3 WGMMA
// rates are the same, so the tiles are the FP8 family's main ones; its extra wave-fit and small-M
// kernels are not repeated here (each line costs four kernels of compile time: two mainloops, two
// output types).
#pragma once

#include "fp8_sm90_configs.h"  // ConfigInfo, RunOpts, Decomp, QB_SM90_CONFIG_INFO

// X(id, name, swap, tile_m, tile_n, tile_k, cluster_m, cluster_n, schedule): as QB_SM90_FP8_CONFIGS.
#define QB_SM90_PLAIN_CONFIGS(X)                                                                  \
  X(kPlainSwap64x16Ping, "plain_swap_64x16x128_ping", true, 64, 16, 128, 1, 1, Ping)              \
  X(kPlainSwap64x64Ping, "plain_swap_64x64x128_ping", true, 64, 64, 128, 1, 1, Ping)              \
  X(kPlainSwap64x128Ping, "plain_swap_64x128x128_ping", true, 64, 128, 128, 1, 1, Ping)           \
  X(kPlainSwap128x64Coop, "plain_swap_128x64x128_coop", true, 128, 64, 128, 1, 1, Coop)           \
  X(kPlainPing128x128Cluster2, "plain_128x128x128_ping_c2x1", false, 128, 128, 128, 2, 1, Ping)          \
  X(kPlainCoop128x128Cluster2, "plain_128x128x128_coop_c2x1", false, 128, 128, 128, 2, 1, Coop)

namespace qb::sm90 {

// The mainloop of a W8A8 kernel: e4m3 with fast accumulation (the FP8 configs), e4m3 promoted into
// fp32 per K tile, or s8 (the plain configs).
enum class Mainloop { kFp8Fast, kFp8Precise, kInt8 };

#define QB_PLAIN_ENUM(id, ...) id,
enum PlainConfigId : int { QB_SM90_PLAIN_CONFIGS(QB_PLAIN_ENUM) kNumPlainConfigs };
#undef QB_PLAIN_ENUM

constexpr ConfigInfo kPlainConfigs[kNumPlainConfigs] = {QB_SM90_PLAIN_CONFIGS(QB_SM90_CONFIG_INFO)};

// Defined (explicitly instantiated) in int8_sm90_inst_*.cu and fp8p_sm90_inst_*.cu. OutTag: 0 bf16,
// 1 fp16.
template <Mainloop kMain, int Id, int OutTag>
int plain_run_config(const ScaledMmArgs& args, const RunOpts& opts, const Err& err);
template <Mainloop kMain, int Id, int OutTag>
size_t plain_config_workspace(const ScaledMmArgs& args, const RunOpts& opts);

}  // namespace qb::sm90
