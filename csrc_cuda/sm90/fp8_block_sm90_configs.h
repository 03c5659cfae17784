// fp8_block_sm90_configs.h: the SM90 block-scaled FP8 kernel configurations, listed once.
//
// Block scaling (DeepSeek-style): a's scales cover 1 x 128 groups of a row, the weight's 128 x 128
// blocks. Each line is instantiated for bf16 and fp16 output.
#pragma once

#include "fp8_sm90_configs.h"  // RunOpts, Decomp

// X(id, name, swap, tile_m, tile_n, cluster_m, cluster_n, overlap)
//   Every config is cooperative (two consumer warpgroups) with the stream-K capable scheduler and a
//   128-deep K step, one scale block per step. swap computes out^T = W . A^T: tile_m then covers
//   the channels (a whole 128-row weight block, one scale per step) and tile_n the tokens.
//   overlap: the consumer loop of block_scaled_overlap_mainloop.cuh (the promotion of one K block
//   runs under the next block's WGMMAs) instead of CUTLASS's (promotion after each block's wait).
#define QB_SM90_FP8_BLOCK_CONFIGS(X)                                                      \
  X(kBlockSwap128x16, "block_swap_128x16x128", true, 128, 16, 1, 1, false)               \
  X(kBlockSwap128x32, "block_swap_128x32x128", true, 128, 32, 1, 1, false)               \
  X(kBlockSwap128x64, "block_swap_128x64x128", true, 128, 64, 1, 1, false)               \
  X(kBlockOverlap128x128, "block_overlap_128x128x128_c1x2", false, 128, 128, 1, 2, true)

namespace qb::sm90 {

struct BlockConfigInfo {
  const char* name;
  bool swap;
  int tile_m, tile_n;
};

#define QB_BLOCK_ENUM(id, ...) id,
enum BlockConfigId : int { QB_SM90_FP8_BLOCK_CONFIGS(QB_BLOCK_ENUM) kNumBlockConfigs };
#undef QB_BLOCK_ENUM

#define QB_BLOCK_INFO(id, name, swap, tm, tn, cm, cn, overlap) {name, swap, tm, tn},
constexpr BlockConfigInfo kBlockConfigs[kNumBlockConfigs] = {QB_SM90_FP8_BLOCK_CONFIGS(QB_BLOCK_INFO)};
#undef QB_BLOCK_INFO

// Defined (explicitly instantiated) in fp8_block_sm90_inst_*.cu. OutTag: 0 bf16, 1 fp16.
template <int Id, int OutTag>
int block_run_config(const ScaledMmArgs& args, const RunOpts& opts, const Err& err);
template <int Id, int OutTag>
size_t block_config_workspace(const ScaledMmArgs& args, const RunOpts& opts);

}  // namespace qb::sm90
