// w8a16_sm90_dispatch.cu: picks the SM90 W8A16 kernel, config and work decomposition for a problem.
//
// Few tokens go to the small-M kernel (fp8_sm90_small_m.cu, its W8A16 form), which streams the
// weight at close to HBM speed; the rest to the CUTLASS mixed-input configs. The small-M kernel is
// listed, forcible, as the config after CUTLASS's (qb_scaled_mm_override: `splits` is its cluster
// size, `swizzle` the tiles each CTA streams alone, as for the FP8 family).
#include "fp8_sm90_configs.h"
#include "fp8_sm90_small_m.h"
#include "w8a16_sm90_configs.h"

namespace qb {
namespace sm90 {
namespace {

using RunFn = int (*)(const ScaledMmArgs&, const RunOpts&, const Err&);
using WsFn = size_t (*)(const ScaledMmArgs&, const RunOpts&);

#define QB_W8A16_RUN(id, ...) {&w8a16_run_config<id, 0>, &w8a16_run_config<id, 1>},
const RunFn kRun[kNumW8A16Configs][2] = {QB_SM90_W8A16_CONFIGS(QB_W8A16_RUN)};
#undef QB_W8A16_RUN
#define QB_W8A16_WS(id, ...) {&w8a16_config_workspace<id, 0>, &w8a16_config_workspace<id, 1>},
const WsFn kWs[kNumW8A16Configs][2] = {QB_SM90_W8A16_CONFIGS(QB_W8A16_WS)};
#undef QB_W8A16_WS

struct Plan {
  int config;
  RunOpts opts;
};

// Fraction of the last wave's SMs that have work, for `tiles` equal tiles on `sms` SMs.
double wave_efficiency(int64_t tiles, int sms) {
  const int64_t waves = cdiv(tiles, sms);
  return double(tiles) / double(waves * sms);
}

// The CUTLASS configs (above 64 tokens), from sweeps of every config and split at M = 1 to 4096 on
// 4096 x 4096, 28672 x 4096 and 4096 x 14336 (bench/probe_w8a16_sm90.py; bench/results/w8a16_sm90_h100.log):
//   M <= 256: the token side of the tile covers M (up to 128, or 256 where those tiles still fill
//             the SMs), so each weight tile is streamed once. 128-row cooperative tiles where they
//             fill the SMs (28672 x 4096), or where K is long enough for stream-K to hand every SM
//             a part of it (4096 x 14336: x1.25 to x1.3 of bf16 against x1.0 to x1.1 data-parallel);
//             otherwise 64-row ping-pong tiles, twice as many CTAs (4096 x 4096: 14.6 us at M = 1
//             against 16.8 for 128x16 with stream-K).
//   M > 256:  128x128 (K step 128) cooperative up to 512 rows, 128x256 above; stream-K where the
//             last wave would be mostly empty.
Plan auto_plan(const ScaledMmArgs& a) {
  const int sms = a.sm_count > 0 ? a.sm_count : 132;
  Plan p{kMix128x256Coop, RunOpts{}};
  if (a.M <= 256) {
    const int64_t row_tiles = cdiv(a.N, 128);
    const bool fills = double(row_tiles * cdiv(a.M, 128)) >= 0.85 * sms;
    if (fills || a.K >= 8192) {
      if (a.M <= 16) p.config = kMix128x16Coop;
      else if (a.M <= 32) p.config = kMix128x32Coop;
      else if (a.M <= 64) p.config = kMix128x64Coop;
      else if (a.M <= 128) p.config = kMix128x128Coop;
      else p.config = double(row_tiles * cdiv(a.M, 256)) >= 0.85 * sms ? kMix128x256Coop : kMix128x128Coop;
      const int64_t tiles = row_tiles * cdiv(a.M, kW8A16Configs[p.config].tile_n);
      p.opts.decomp = tiles < sms ? Decomp::StreamK : Decomp::DataParallel;
      return p;
    }
    p.config = a.M <= 32 ? kMix64x16Ping : a.M <= 128 ? kMix64x64Ping : kMix64x128Ping;
    return p;
  }
  p.config = a.M <= 512 ? kMix128x128K128Coop : kMix128x256Coop;
  const auto& c = kW8A16Configs[p.config];
  const int64_t tiles = cdiv(a.N, c.tile_m) * cdiv(a.M, c.tile_n);
  p.opts.decomp = wave_efficiency(tiles, sms) < 0.75 ? Decomp::StreamK : Decomp::DataParallel;
  return p;
}

// The automatic plan with any forced choice (qb_scaled_mm_override) applied.
Plan plan_for(const ScaledMmArgs& a) {
  Plan p = auto_plan(a);
  if (a.config >= 0 && a.config < kNumW8A16Configs) p.config = a.config;
  if (a.decomp >= 0 && a.decomp <= 3) p.opts.decomp = static_cast<Decomp>(a.decomp);
  if (a.splits > 0) p.opts.splits = a.splits;
  if (a.swizzle > 0) p.opts.swizzle = a.swizzle;
  if (!kW8A16Configs[p.config].streamk) p.opts.decomp = Decomp::DataParallel;
  p.opts.programmatic = a.programmatic;
  return p;
}

int act_tag(const ScaledMmArgs& a) { return a.out_dtype == QB_F16 ? 1 : 0; }

constexpr int kStreamConfig = kNumW8A16Configs;  // the small-M kernel's config id

// The small-M kernel's plan, up to 64 tokens: 64-row tiles (its only W8A16 tile), one per CTA; where
// they cover at most half the SMs, K split in two across a cluster of two CTAs. From the sweep in
// bench/results/w8a16_sm90_h100.log (H100): at 4096 x 4096, M = 1, 10.1 us with the split against
// 14.1 without; at 28672 x 4096 one tile per CTA (448 CTAs) 46.2 us against 55.3 with each CTA
// streaming several tiles. Up to 64 tokens it was the fastest W8A16 kernel at every shape swept.
bool small_m_plan(const ScaledMmArgs& a, SmallMPlan* plan) {
  if (a.config == kStreamConfig) {
    *plan = small_m_forced_plan(a, 64, a.splits, a.swizzle);
    return true;
  }
  if (a.config >= 0 || a.M > 64) return false;
  const int sms = a.sm_count > 0 ? a.sm_count : 132;
  *plan = small_m_forced_plan(a, 64, 2 * cdiv(a.N, 64) <= sms ? 2 : 1, 0);
  return true;
}
}  // namespace
}  // namespace sm90

int sm90_w8a16_scaled_mm(const ScaledMmArgs& args, const Err& err) {
  using namespace sm90;
  SmallMPlan small;
  if (small_m_plan(args, &small)) return small_m_run(args, small, err);
  Plan p = plan_for(args);
  const int tag = act_tag(args);
  // Without the workspace the split needs, run the same tiles unsplit.
  if (p.opts.decomp != Decomp::DataParallel && kWs[p.config][tag](args, p.opts) > args.workspace_size)
    p.opts.decomp = Decomp::DataParallel;
  return kRun[p.config][tag](args, p.opts, err);
}

size_t sm90_w8a16_workspace(const ScaledMmArgs& args) {
  using namespace sm90;
  SmallMPlan small;
  if (small_m_plan(args, &small)) return 0;
  const Plan p = plan_for(args);
  return kWs[p.config][act_tag(args)](args, p.opts);
}

int sm90_w8a16_config_count() { return sm90::kNumW8A16Configs + 1; }

const char* sm90_w8a16_config_name(int config) {
  if (config == sm90::kStreamConfig) return "w8a16_stream_64";
  return config >= 0 && config < sm90::kNumW8A16Configs ? sm90::kW8A16Configs[config].name : nullptr;
}

}  // namespace qb
