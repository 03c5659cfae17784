// fp8_sm90_small_m.h: the SM90 FP8 GEMM for few tokens (fp8_sm90_small_m.cu), as the dispatcher
// sees it: a plan (tile rows, token tile, ring depth, split of K across a cluster) and a launch.
#pragma once

#include "../common/qb_common.h"

namespace qb::sm90 {

// The dispatcher lists these after the CUTLASS configs, as configs kNumConfigs + i.
constexpr int kSmallMConfigs = 2;
constexpr const char* kSmallMNames[kSmallMConfigs] = {"stream_64", "stream_128"};
constexpr int kSmallMRows[kSmallMConfigs] = {64, 128};  // weight rows (output columns) per CTA

struct SmallMPlan {
  int rows;            // weight rows per tile: 64 or 128
  int tokens;          // token tile: 8, 16, 32 or 64 (M is covered by ceil(M / tokens) tiles)
  int stages;          // depth of the shared-memory ring
  int act_bytes;       // 1: e4m3 activations; 2: bf16/fp16 (W8A16: 64-row tiles only)
  int splits;          // CTAs of one cluster that share the cluster's last tile's K range (1 to 8)
  int whole;           // tiles each CTA streams alone before that shared tile (0: only the shared one)
  int64_t row_tiles, token_tiles;
  int64_t clusters;    // row tiles / (splits * whole + 1), rounded up
};

// The automatic plan for this problem, or false when the CUTLASS configs should run it instead.
bool small_m_auto_plan(const ScaledMmArgs& a, SmallMPlan* plan);
// A forced plan (tuning and tests): any M, the given rows per tile, `splits` CTAs per cluster and
// `whole` tiles per CTA before the shared one (< 0: none). splits < 1: the automatic split and
// tiles per CTA for these rows.
SmallMPlan small_m_forced_plan(const ScaledMmArgs& a, int rows, int splits, int whole);
int small_m_run(const ScaledMmArgs& a, const SmallMPlan& plan, const Err& err);

}  // namespace qb::sm90
