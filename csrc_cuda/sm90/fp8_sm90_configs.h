// fp8_sm90_configs.h: the SM90 FP8 kernel configurations, listed once.
//
// Compile-time choices (tile, cluster, schedule, operand swap) live here; the split of work across
// SMs (data-parallel, split-K, stream-K) is chosen at run time by the dispatcher for the stream-K
// capable (cooperative) configs, which costs no extra instantiation. Every config is instantiated
// for bf16 and fp16 output, so each line costs two kernels of compile time: keep the list short.
#pragma once

#include "../common/qb_common.h"

// X(id, name, swap, tile_m, tile_n, tile_k, cluster_m, cluster_n, schedule)
//   id: the enumerator the code names the config by; its position in this list is its number in the
//       C ABI (qb_*_config_name), so a config is never named by a bare number.
//   schedule: Coop (cooperative, stream-K scheduler) or Ping (ping-pong, persistent scheduler)
//   swap: computes out^T = W . A^T, so tile_n covers the tokens (M) and tile_m the channels (N).
#define QB_SM90_FP8_CONFIGS(X)                                                            \
  X(kSwap64x16Ping, "swap_64x16x128_ping", true, 64, 16, 128, 1, 1, Ping)                 \
  X(kSwap64x32Ping, "swap_64x32x128_ping", true, 64, 32, 128, 1, 1, Ping)                 \
  X(kSwap64x64Ping, "swap_64x64x128_ping", true, 64, 64, 128, 1, 1, Ping)                 \
  X(kSwap64x96Ping, "swap_64x96x128_ping", true, 64, 96, 128, 1, 1, Ping)                 \
  X(kSwap128x64Coop, "swap_128x64x128_coop", true, 128, 64, 128, 1, 1, Coop)              \
  X(kCoop128x128, "128x128x128_coop", false, 128, 128, 128, 1, 1, Coop)                   \
  X(kCoop128x256Cluster2, "128x256x128_coop_c2x1", false, 128, 256, 128, 2, 1, Coop)      \
  X(kPing128x128Cluster2, "128x128x128_ping_c2x1", false, 128, 128, 128, 2, 1, Ping)      \
  X(kSwap64x128Ping, "swap_64x128x128_ping", true, 64, 128, 128, 1, 1, Ping)              \
  X(kCoop128x96, "128x96x128_coop", false, 128, 96, 128, 1, 1, Coop)                      \
  X(kCoop128x192, "128x192x128_coop", false, 128, 192, 128, 1, 1, Coop)                   \
  X(kPing128x160Cluster2, "128x160x128_ping_c2x1", false, 128, 160, 128, 2, 1, Ping)      \
  X(kCoop128x224, "128x224x128_coop", false, 128, 224, 128, 1, 1, Coop)                   \
  X(kPing64x80, "64x80x128_ping", false, 64, 80, 128, 1, 1, Ping)                       \
  X(kSwap64x64PingTokenPair, "swap_64x64x128_ping_c1x2", true, 64, 64, 128, 1, 2, Ping)       \
  X(kPing64x96Cluster2, "64x96x128_ping_c2x1", false, 64, 96, 128, 2, 1, Ping)           \
  X(kPing64x160Cluster2, "64x160x128_ping_c2x1", false, 64, 160, 128, 2, 1, Ping)        \
  X(kPing64x224Cluster2, "64x224x128_ping_c2x1", false, 64, 224, 128, 2, 1, Ping)        \
  X(kSwap64x192Ping, "swap_64x192x128_ping", true, 64, 192, 128, 1, 1, Ping)

namespace qb::sm90 {

enum class Decomp { DataParallel, SplitK, StreamK, Heuristic };

struct RunOpts {
  Decomp decomp = Decomp::DataParallel;
  int splits = 1;   // SplitK only
  int swizzle = 1;  // tile rasterization swizzle (1, 2, 4, 8): neighbouring CTAs share A/B tiles in L2
  bool programmatic = false;  // launch as a programmatic dependent (PDL) of the previous kernel
};

struct ConfigInfo {
  const char* name;
  bool swap;
  int tile_m, tile_n, tile_k;
  int cluster_m, cluster_n;
  bool streamk;  // cooperative with the stream-K scheduler: run-time decomposition choice
};

#define QB_ENUM(id, ...) id,
enum ConfigId : int { QB_SM90_FP8_CONFIGS(QB_ENUM) kNumConfigs };
#undef QB_ENUM

// One kConfigs entry from an X(...) line (also of the plain list, plain_sm90_configs.h).
#define QB_SM90_CONFIG_INFO(id, name, swap, tm, tn, tk, cm, cn, sched) {name, swap, tm, tn, tk, cm, cn, #sched[0] == 'C'},
constexpr ConfigInfo kConfigs[kNumConfigs] = {QB_SM90_FP8_CONFIGS(QB_SM90_CONFIG_INFO)};

// Whole token tiles. The TMA copy of a token tile that reaches past the last row of A fills the
// missing rows with zeros, and that fill is slow when many rows are missing: on the H200, x1.4 to
// x1.5 the time of the same GEMM on whole tiles at M = 72 with 128-token tiles, x1.1 to x1.2 at
// M = 66 with 96-token ones, 5 to 10 % at M = 40 with 64-token ones; no consistent cost with fewer
// than 24 rows missing (M = 112 on 128-token tiles: whole ones 3 % faster on average over four
// shapes, 14 % slower on one; M = 48 and 56 on 64: within 3 %) nor in the small-M kernel's tiles
// (M <= 32). Above 128 tokens: M = 200 took 13.3 / 39.3 us on 4096 x 4096 / 4096 x 14336 where
// M = 256 took 10.4 / 30.7. (bench/results/scaled_mm_ab_h200.log, the partial token tiles sections.)
constexpr int64_t kMinMissingRows = 24;

// Defined (explicitly instantiated) in fp8_sm90_inst_*.cu. OutTag: 0 bf16, 1 fp16.
template <int Id, int OutTag>
int run_config(const ScaledMmArgs& args, const RunOpts& opts, const Err& err);
template <int Id, int OutTag>
size_t config_workspace(const ScaledMmArgs& args, const RunOpts& opts);

}  // namespace qb::sm90
