// w8a16_sm90_configs.h: the SM90 W8A16 kernel configurations, listed once.
//
// Every config computes the transposed product (w8a16_sm90_kernel.cuh): tile_m covers channels
// (weight rows), tile_n tokens. Each line is instantiated for bf16 and fp16 activations.
#pragma once

#include "../common/qb_common.h"

// X(id, name, tile_m, tile_n, tile_k, cluster_m, cluster_n, schedule)
//   schedule: MixedCoop (cooperative, stream-K scheduler: split along K chosen at run time) or
//   MixedPing (ping-pong, persistent scheduler).
#define QB_SM90_W8A16_CONFIGS(X)                                        \
  X(kMix128x16Coop, "w8a16_128x16x64_coop", 128, 16, 64, 1, 1, MixedCoop)   \
  X(kMix128x32Coop, "w8a16_128x32x64_coop", 128, 32, 64, 1, 1, MixedCoop)   \
  X(kMix128x64Coop, "w8a16_128x64x64_coop", 128, 64, 64, 1, 1, MixedCoop)   \
  X(kMix128x128Coop, "w8a16_128x128x64_coop", 128, 128, 64, 1, 1, MixedCoop) \
  X(kMix128x256Coop, "w8a16_128x256x64_coop", 128, 256, 64, 1, 1, MixedCoop) \
  X(kMix64x16Ping, "w8a16_64x16x64_ping", 64, 16, 64, 1, 1, MixedPing)      \
  X(kMix64x64Ping, "w8a16_64x64x64_ping", 64, 64, 64, 1, 1, MixedPing)      \
  X(kMix64x128Ping, "w8a16_64x128x64_ping", 64, 128, 64, 1, 1, MixedPing)   \
  X(kMix128x128K128Coop, "w8a16_128x128x128_coop", 128, 128, 128, 1, 1, MixedCoop)

namespace qb::sm90 {

struct W8A16ConfigInfo {
  const char* name;
  int tile_m, tile_n, tile_k;
  bool streamk;
};

#define QB_W8A16_ENUM(id, ...) id,
enum W8A16ConfigId : int { QB_SM90_W8A16_CONFIGS(QB_W8A16_ENUM) kNumW8A16Configs };
#undef QB_W8A16_ENUM

#define QB_W8A16_INFO(id, name, tm, tn, tk, cm, cn, sched) {name, tm, tn, tk, #sched[5] == 'C'},
constexpr W8A16ConfigInfo kW8A16Configs[kNumW8A16Configs] = {QB_SM90_W8A16_CONFIGS(QB_W8A16_INFO)};
#undef QB_W8A16_INFO

// Defined (explicitly instantiated) in w8a16_sm90_inst_*.cu. ActTag: 0 bf16, 1 fp16.
template <int Id, int ActTag>
int w8a16_run_config(const ScaledMmArgs& args, const RunOpts& opts, const Err& err);
template <int Id, int ActTag>
size_t w8a16_config_workspace(const ScaledMmArgs& args, const RunOpts& opts);

}  // namespace qb::sm90
