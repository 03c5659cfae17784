// fp8_grouped_sm90_configs.h: the SM90 grouped FP8 kernel configurations, listed once.
//
// X(id, name, block, swap, tile_m, tile_n, cluster_m, cluster_n)
//   Every config is a CUTLASS ptr-array cooperative kernel (TMA + WGMMA, two consumer warpgroups,
//   128-deep K steps) with the grouped persistent tile scheduler. block: the blockwise
//   mainloop (block scales, promoted per K block); else FP8 fast accumulation with per-tensor or
//   per-row / column scales in the epilogue. swap computes out^T = W_g . A_g^T per group: tile_m
//   then covers the channels and tile_n the group's tokens, so a group of a few tokens costs one
//   narrow tile per 128 channels instead of a 128-row tile of padding.
//   Not kept (H100, bench/results/probe_grouped_sm90_block_trials_h100.txt): block 128 x 128 with the overlapped
//   consumer loop of the one-GEMM family (x0.93 to x1.01) and with it in 1 x 2 clusters (x0.88 to
//   x1.07 at 4096 and 16384 tokens: faster on DeepSeek-V3's down layer, slower on gate_up); and
//   swapped 128 x 64 for 17 to 64 rows per group (bench/results/probe_grouped_sm90_swap64_trial_h100.txt:
//   at 64 rows per group slower than 128 x 128 on Mixtral, 447 against 359 us and 219 against 177,
//   and no faster on Qwen3, 172 against 165 and 110 against 108).
// Each line is instantiated for bf16 and fp16 output (fp8_grouped_sm90_inst_*.cu).
#pragma once

#include <cstddef>

#include "../common/grouped.h"

#define QB_SM90_FP8_GROUPED_CONFIGS(X)                                                           \
  X(kGroupedBlockSwap128x32, "sm90_grouped_block_swap_128x32x128", true, true, 128, 32, 1, 1)      \
  X(kGroupedBlock128x128, "sm90_grouped_block_128x128x128", true, false, 128, 128, 1, 1)          \
  X(kGroupedSwap128x32, "sm90_grouped_swap_128x32x128", false, true, 128, 32, 1, 1)               \
  X(kGrouped128x128, "sm90_grouped_128x128x128", false, false, 128, 128, 1, 1)                    \
  X(kGrouped128x256C2x1, "sm90_grouped_128x256x128_c2x1", false, false, 128, 256, 2, 1)

namespace qb::sm90 {

struct GroupedConfigInfo {
  const char* name;
  bool block;  // takes block scales (else per-tensor / per-row / per-column ones)
  bool swap;
};

#define QB_GROUPED_ENUM(id, ...) id,
enum GroupedConfigId : int { QB_SM90_FP8_GROUPED_CONFIGS(QB_GROUPED_ENUM) kNumGroupedConfigs };
#undef QB_GROUPED_ENUM

#define QB_GROUPED_INFO(id, name, block, swap, ...) {name, block, swap},
constexpr GroupedConfigInfo kGroupedConfigs[kNumGroupedConfigs] = {QB_SM90_FP8_GROUPED_CONFIGS(QB_GROUPED_INFO)};
#undef QB_GROUPED_INFO

// Defined (explicitly instantiated) in fp8_grouped_sm90_inst_*.cu. OutTag: 0 bf16, 1 fp16.
// grouped_config_workspace: the bytes run needs for these sizes and this many SMs (the per-group
// argument arrays written on the device, and CUTLASS's own scratch).
template <int Id, int OutTag>
int grouped_run_config(const GroupedArgs& args, int sm_count, const Err& err);
template <int Id, int OutTag>
size_t grouped_config_workspace(const GroupedArgs& args, int sm_count);

}  // namespace qb::sm90
