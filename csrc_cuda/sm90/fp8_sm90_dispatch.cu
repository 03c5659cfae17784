// fp8_sm90_dispatch.cu: picks the SM90 FP8 config and the work decomposition for a problem.
//
// Buckets by M (tuned on the H200, see bench/bench_scaled_mm.py --tune): small M swaps operands so
// the tokens sit on the tile's narrow N side; large M uses 128x128 ping-pong tiles. Cooperative
// configs may split K across SMs (stream-K / split-K), which needs the caller's workspace; without
// one they run data-parallel. Tiles 96 or 192 channels wide fill waves that 64- and 128-wide tiles
// leave ragged (wave_fit_config). Up to 32 tokens, the dispatcher first asks the small-M kernel
// (fp8_sm90_small_m.cu) for a plan; it is also listed, forcible, as the configs after CUTLASS's.
#include <algorithm>

#include "fp8_sm90_configs.h"
#include "fp8_sm90_small_m.h"

namespace qb {
namespace sm90 {
namespace {

using RunFn = int (*)(const ScaledMmArgs&, const RunOpts&, const Err&);
using WsFn = size_t (*)(const ScaledMmArgs&, const RunOpts&);

#define QB_RUN(id, ...) {&run_config<id, 0>, &run_config<id, 1>},
const RunFn kRun[kNumConfigs][2] = {QB_SM90_FP8_CONFIGS(QB_RUN)};
#undef QB_RUN
#define QB_WS(id, ...) {&config_workspace<id, 0>, &config_workspace<id, 1>},
const WsFn kWs[kNumConfigs][2] = {QB_SM90_FP8_CONFIGS(QB_WS)};
#undef QB_WS

struct Plan {
  int config;
  RunOpts opts;
};

// Fraction of the last wave's SMs that have work, for `tiles` equal tiles on `sms` SMs.
double wave_efficiency(int64_t tiles, int sms) {
  const int64_t waves = cdiv(tiles, sms);
  return double(tiles) / double(waves * sms);
}

// Config, decomposition and swizzle by M bucket, from the H200 sweeps (bench_scaled_mm.py --tune):
//   (M <= 32: the small-M kernel first, where small_m_auto_plan takes the problem; otherwise:)
//   M <= 128  memory-bound: swapped persistent 64-row ping-pong tiles whose token side (16, 32, 64
//             or 128) covers all of M, so each weight tile is read by one CTA, once (tiles that
//             two CTAs read were measured up to 30 % slower);
//             64-row tiles give twice the CTAs of 128-row ones, so more SMs stream the weight.
//             Stream-K's cross-CTA reduction cost more than it saved at these sizes.
//   M <= 256  N <= 4096: swapped 128x64 cooperative tiles (data-parallel); a last wave under 75 %
//             full: 128x128 cooperative with stream-K; otherwise 128x128 ping-pong (cluster 2x1).
//   larger    128x128 ping-pong (cluster 2x1). A ragged last wave does not call for stream-K here:
//             at 512x6144x4096 (192 tiles, last wave 45 % full) 128x128 stream-K took 31.4 us, the
//             other candidates 27.4 to 28.0 (bench/ab_configs.py: interleaved rounds, median of 3).
//   M >= 8192 with K >= 8192: 128x256 cooperative, swizzle 8, stream-K. Its hybrid schedule runs
//             the full waves data-parallel and splits only the last wave's tiles along K. Against
//             the same config under CUTLASS's heuristic (which stays data-parallel here) it was
//             faster at 15 of the 16 issue-3 shapes' points with M = 4096 and 8192, by up to 9 %; at
//             M = 8192 it (or the same with swizzle 1) was the fastest candidate at all 5 shapes with
//             K >= 8192, 1 to 8 % ahead of the fastest 128x128 ping-pong. Below M = 8192 it is not
//             used: at M = 4096 the ping-pong tiles of the next rule were as fast or faster at 4 of
//             those 5 shapes (by up to 3.6 %: 390.7 against 405.4 us at N = 4096, K = 14336), and at
//             M = 2048, N = 57344, K = 8192 ping-pong took 1495 us, this config under the heuristic
//             1585. Nor at K = 4096: at M = 8192, N = 28672, ping-pong with swizzle 8 took 1492.9 us
//             against 1585.1 (and 3241 against 3192 at M = 16384, within the A/B's spread).
//   M >= 4096, N >= 8192 otherwise: 128x128 ping-pong with swizzle 8 (groups of 8 tiles share their
//             A and B tiles in L2): of swizzles 1, 4 and 8 the fastest at 4 of the 5 shapes with
//             N >= 8192 at M = 4096 (28672 x 4096: swizzle 4, 3 % ahead), and at N = 28672, K = 4096,
//             M = 8192 and 16384. Narrower N keeps swizzle 1 (swizzle 8 was up to 6 % slower at
//             N = 6144).
//             (bench/results/scaled_mm_ab_h200.log, the large-M section at its top.)
//   Wave fit, 64 < M <= 512: the configs above use tiles 64 (swapped, M <= 128) or 128 channels wide.
//             Where those leave the last wave ragged (N = 10240 at M = 128: 160 tiles of 64 rows for
//             132 SMs, so the busiest SMs stream two tiles while most stream one), 128-token tiles 96
//             or 192 channels wide can fill one wave or whole waves instead. The slowest SM's load is
//             (waves x tile width) channel rows; the other width is used when that is at most 80 % of
//             the default's (a margin for the 96-wide tile's lower arithmetic intensity), the wider
//             one where both fill equally. A/B on the H200 (bench/results/scaled_mm_ab_h200.log):
//             M = 128, N = 10240 (96 wide): 28.3 us against 33.5 for the swapped 64x128 tiles;
//             M = 256, N = 6144 (96): 12.6 against 16.8 for 128x128 ping-pong; N = 10240 (192): 42.5
//             against 56.0; M = 512, N = 6144 (192): 23.7 against 27.2. Where both widths fill the
//             waves equally they measured within 10 % of each other (forced: 42.8 and 45.2 us at
//             M = 256, N = 10240; 22.5 and 24.6 at M = 512, N = 6144). Not at M <= 64: half of the
//             128-token tile idles there, and in trial runs it was slower than the swapped 64x64
//             tiles at M = 64, N = 10240. Nor for 128 < M <= 256 with N <= 4096, the bucket the swapped
//             128x64 tiles were tuned for.
int wave_fit_config(const ScaledMmArgs& a, int sms) {
  if (a.M <= 64 || a.M > 512 || (a.M > 128 && a.M <= 256 && a.N <= 4096)) return -1;
  const int64_t token_tiles = cdiv(a.M, 128);
  const int default_width = a.M <= 128 ? 64 : 128;
  auto load = [&](int width) { return cdiv(token_tiles * cdiv(a.N, width), sms) * width; };
  const int64_t base = load(default_width), w192 = load(192), w96 = load(96);
  if (5 * std::min(w192, w96) > 4 * base) return -1;
  return w192 <= w96 ? 12 : 11;
}

Plan pick_plan(const ScaledMmArgs& a) {
  Plan p{};
  const int sms = a.sm_count > 0 ? a.sm_count : 132;
  if (const int fit = wave_fit_config(a, sms); fit >= 0) {
    p.config = fit;
    return p;
  }
  const int64_t tiles128 = cdiv(a.M, 256) * 2 * cdiv(a.N, 128);  // cluster 2x1: M tiles in pairs
  const bool ragged_last_wave = tiles128 > sms && wave_efficiency(tiles128, sms) < 0.75;
  if (a.M <= 128) {
    p.config = a.M <= 16 ? 0 : a.M <= 32 ? 1 : a.M <= 64 ? 2 : 9;
  } else if (a.M <= 256) {
    if (a.N <= 4096) {
      p.config = 4;
    } else if (ragged_last_wave) {
      p.config = 5;
      p.opts.decomp = Decomp::StreamK;
    } else {
      p.config = 7;
    }
  } else if (a.M >= 8192 && a.K >= 8192) {
    p.config = 6;
    p.opts.decomp = Decomp::StreamK;
    p.opts.swizzle = 8;
  } else {
    p.config = 7;
    if (a.M >= 4096 && a.N >= 8192) p.opts.swizzle = 8;
  }
  return p;
}

Plan make_plan(const ScaledMmArgs& a) {
  Plan p = pick_plan(a);
  if (a.config >= 0 && a.config < kNumConfigs && a.config != p.config) {
    p.config = a.config;  // forced config: its own defaults unless also forced below
    p.opts = RunOpts{};
    if (kConfigs[p.config].streamk) p.opts.decomp = Decomp::Heuristic;
  }
  if (a.swizzle > 0) p.opts.swizzle = a.swizzle;
  if (a.decomp >= 0) {
    p.opts.decomp = static_cast<Decomp>(a.decomp > 3 ? 0 : a.decomp);
    if (p.opts.decomp == Decomp::SplitK) p.opts.splits = a.splits > 1 ? a.splits : 2;
  }
  if (!kConfigs[p.config].streamk) p.opts.decomp = Decomp::DataParallel;
  return p;
}

}  // namespace
}  // namespace sm90

namespace {
// The small-M plan this call runs, if it runs the small-M kernel: forced as a config (its cluster
// size then comes from the override's `splits` and its tiles per CTA before the shared one from
// `swizzle`), or chosen automatically. Configs past the last one run nothing here
// (sm90_fp8_scaled_mm reports them).
bool small_m_plan(const ScaledMmArgs& a, sm90::SmallMPlan* plan) {
  const int forced = a.config - sm90::kNumConfigs;
  if (forced >= sm90::kSmallMConfigs) return false;
  if (forced >= 0) {
    *plan = sm90::small_m_forced_plan(a, sm90::kSmallMRows[forced], a.splits, a.swizzle);
    return true;
  }
  return a.config < 0 && sm90::small_m_auto_plan(a, plan);
}
}  // namespace

size_t sm90_fp8_workspace(const ScaledMmArgs& a) {
  sm90::SmallMPlan small;
  if (small_m_plan(a, &small)) return 0;
  const sm90::Plan p = sm90::make_plan(a);
  return sm90::kWs[p.config][a.out_dtype == QB_F16](a, p.opts);
}

int sm90_fp8_scaled_mm(const ScaledMmArgs& a, const Err& err) {
  if (a.config >= sm90::kNumConfigs + sm90::kSmallMConfigs)
    return err.set(QB_ERR_INVALID_ARGUMENT, "sm90 fp8: config %d out of range (%d configs)", a.config,
                   sm90::kNumConfigs + sm90::kSmallMConfigs);
  sm90::SmallMPlan small;
  if (small_m_plan(a, &small)) return sm90::small_m_run(a, small, err);
  sm90::Plan p = sm90::make_plan(a);
  const int tag = a.out_dtype == QB_F16;
  if (p.opts.decomp != sm90::Decomp::DataParallel) {
    const size_t need = sm90::kWs[p.config][tag](a, p.opts);
    if (need > 0 && (a.workspace == nullptr || a.workspace_size < need)) p.opts.decomp = sm90::Decomp::DataParallel;
  }
  // Programmatic launch only for data-parallel runs: a stream-K run's workspace is reset by a
  // separate operation just before it, which must stay an ordinary stream dependency.
  p.opts.programmatic = a.programmatic && p.opts.decomp == sm90::Decomp::DataParallel;
  return sm90::kRun[p.config][tag](a, p.opts, err);
}

int sm90_fp8_auto_config(const ScaledMmArgs& a, int* decomposition, int* splits, int* swizzle) {
  ScaledMmArgs q = a;
  q.config = q.decomp = q.splits = q.swizzle = -1;  // the automatic choice, whatever is forced
  sm90::SmallMPlan small;
  if (sm90::small_m_auto_plan(q, &small)) {
    *decomposition = 0;
    *splits = small.splits;  // CTAs per cluster
    *swizzle = small.whole;  // tiles per CTA before the cluster's shared one
    for (int i = 0; i < sm90::kSmallMConfigs; ++i)
      if (sm90::kSmallMRows[i] == small.rows) return sm90::kNumConfigs + i;
    return -1;
  }
  const sm90::Plan p = sm90::make_plan(q);
  *decomposition = static_cast<int>(p.opts.decomp);
  *splits = p.opts.splits;
  *swizzle = p.opts.swizzle;
  return p.config;
}

int sm90_fp8_config_count() { return sm90::kNumConfigs + sm90::kSmallMConfigs; }

const char* sm90_fp8_config_name(int config) {
  if (config >= 0 && config < sm90::kNumConfigs) return sm90::kConfigs[config].name;
  if (config >= sm90::kNumConfigs && config < sm90::kNumConfigs + sm90::kSmallMConfigs)
    return sm90::kSmallMNames[config - sm90::kNumConfigs];
  return nullptr;
}

}  // namespace qb
