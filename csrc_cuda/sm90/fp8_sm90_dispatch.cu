// fp8_sm90_dispatch.cu: picks the SM90 FP8 config and the work decomposition for a problem.
//
// Buckets by M (tuned on the H200, see bench/bench_scaled_mm.py --tune): small M swaps operands so
// the tokens sit on the tile's narrow N side; large M uses 128x128 ping-pong tiles. Cooperative
// configs may split K across SMs (stream-K / split-K), which needs the caller's workspace; without
// one they run data-parallel. Tiles 80 to 224 channels wide fill waves that 64- and 128-wide tiles
// leave ragged (wave_fit_config). Up to 32 tokens, the dispatcher first asks the small-M kernel
// (fp8_sm90_small_m.cu) for a plan; it is also listed, forcible, as the configs after CUTLASS's.
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

// Tokens per tile of a config: the swapped configs' tile_n, the others' tile_m.
int64_t token_tile(int config) { return kConfigs[config].swap ? kConfigs[config].tile_n : kConfigs[config].tile_m; }

// Channels (weight rows) per tile of a config: the swapped configs' tile_m, the others' tile_n.
int channel_tile(int config) { return kConfigs[config].swap ? kConfigs[config].tile_m : kConfigs[config].tile_n; }

struct Plan {
  int config;
  RunOpts opts;
};

// Whether the swapped 64-row weight tiles, each shared by a pair of 64-token tiles in a 1x2 cluster,
// fit in one wave: the default for 96 < M <= 128 where they do (see pick_plan).
bool swapped_pairs_fit(const ScaledMmArgs& a, int sms) {
  return 2 * cdiv(a.N, kConfigs[kSwap64x64PingTokenPair].tile_m) <= sms;
}

// Fraction of the last wave's SMs that have work, for `tiles` equal tiles on `sms` SMs.
double wave_efficiency(int64_t tiles, int sms) {
  const int64_t waves = cdiv(tiles, sms);
  return double(tiles) / double(waves * sms);
}

// Config, decomposition and swizzle by M bucket, from the H200 sweeps (bench_scaled_mm.py --tune):
//   (M <= 64: the small-M kernel first, where small_m_auto_plan takes the problem; otherwise:)
//   M <= 128  memory-bound: swapped persistent 64-row ping-pong tiles whose token side (16, 32, 64,
//             96 or 128) covers all of M, so each weight tile is read by one CTA, once (tiles that
//             two CTAs read were measured up to 30 % slower);
//             64-row tiles give twice the CTAs of 128-row ones, so more SMs stream the weight.
//             Stream-K's cross-CTA reduction cost more than it saved at these sizes. 96-token tiles
//             for 64 < M <= 96: the 128-token ones spend x1.2 to x1.5 the time there on filling the
//             rows past M (M = 72: 21.3 against 32.5 us at 4096 x 14336, 11.1 against 14.3 at
//             6144 x 4096; see token_rows for the fill).
//             96 < M <= 128 where two CTAs per 64-row weight tile fit on the SMs (N <= 4224 on 132):
//             64-token tiles in 1x2 clusters, the pair sharing each weight tile through TMA multicast,
//             so twice the SMs multiply while HBM and L2 deliver each weight tile once. M = 128:
//             20.2 / 21.0 us (two runs) against 23.6 / 27.1 for the 128-token tiles at 4096 x 14336
//             (cuBLASLt tensorwise 21.6 / 22.4), 7.2 / 7.5 against 8.2 / 8.6 at 4096 x 4096; without
//             the clusters the pair of CTAs reads each tile twice (22.8 and 8.4 in the first run).
//             Where the pairs need a second wave they lost: N = 6144: 10.9 against 10.4, N = 8192:
//             23.9 against 22.9. Not for M <= 96, whose second token tile would miss 32 rows or more
//             (M = 96: 25.8 against 20.7 for 96-token tiles).
//   M <= 256  N <= 4096: swapped 128x64 cooperative tiles (data-parallel), or where two 128-token
//             tiles miss fewer than kMinMissingRows rows, swapped 64x128 ping-pong ones (M = 256:
//             10.5 / 30.1 us against 11.4 / 32.3 at 4096 x 4096 / 4096 x 14336); a last wave under 75 %
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
//             (bench/results/scaled_mm_ab_h200.log, its large-M section.)
//   Wave fit, 32 < M <= 2048: the configs above use tiles 64 (swapped, M <= 128) or 128 channels
//             wide. Where those leave the last wave ragged (N = 10240 at M = 128: 160 tiles of 64 rows
//             for 132 SMs, so the busiest SMs stream two tiles while most stream one), tiles of
//             another width can fill one wave or whole waves instead. The slowest SM's load is
//             (waves x tile width) channel rows; a candidate replaces the default when its load is
//             at most the default's, and the one with the least load is used (the wider at equal
//             load). The candidates:
//             - 80 wide with the tokens on the 64-row side, ping-pong (32 < M <= 64, one token
//               tile): M = 64 / 40, N = 10240: 24.1 / 24.5 us against 27.9 / 28.6 for the swapped
//               64x64 tiles (cuBLASLt tensorwise 26.0 / 24.3); N = 28672: 33.5 / 34.5 against
//               34.2 / 35.6. Where it fills worse it is slower (N = 6144: 11.2 against 9.8).
//             - 96 and 192 wide, cooperative (64 < M <= 512): only at 80 % of the default's load or
//               less, a margin for the 96-wide tile's lower arithmetic intensity. A/B on the H200
//               (bench/results/scaled_mm_ab_h200.log): M = 128, N = 10240 (96 wide): 28.3 us against
//               33.5 for the swapped 64x128 tiles; M = 256, N = 6144 (96): 12.6 against 16.8 for
//               128x128 ping-pong; M = 512, N = 6144 (192): 23.7 against 27.2. Where both widths fill
//               the waves equally they measured within 10 % of each other. Not at M <= 64: half of
//               the 128-token tile idles there, and in trial runs it was slower than the swapped 64x64
//               tiles at M = 64, N = 10240. Nor for 128 < M <= 256 with N <= 4096, the bucket the
//               swapped 128x64 tiles were tuned for.
//             - 160 wide, ping-pong in 2x1 clusters like the default (128 < M <= 2048; its clusters
//               pair two token tiles, so not at M <= 128). M = 256 / 512, N = 10240: 38.4 / 68.6 us
//               against 56.3 / 83.9 for 128x128 ping-pong and 43.8 / 87.1 for 128x192 cooperative
//               (cuBLASLt tensorwise 39.2 / 71.6); M = 256, N = 28672: 55.4 against 61.9; M = 512 and
//               1024, N = 57344: 375.2 and 759.2 against 409.7 and 784.8. At equal fill (M = 1024,
//               N = 10240; M = 2048, N = 10240 and 57344) the two were within 2 %. Where 160 fills
//               worse it is slower (M = 256, N = 57344: 224.6 against 219.6).
//             - 224 wide, cooperative (64 < M <= 128): one tile row of tokens reads each weight tile
//               once, like the swapped 64-row default, but reads the tokens once per 224 channels
//               instead of once per 64. M = 128, N = 57344 (equal fill): 139.7 us against 148.3;
//               N = 28672: 38.7 against 39.6.
//             - 96, 160 and 224 wide with 64 tokens on the tile's 64-row side, ping-pong in 2x1
//               clusters (96 < M <= 128): the cluster pairs the two token tiles, and TMA multicasts
//               each weight tile to both CTAs, so the weight is still read once while each SM holds
//               half the tokens (cuBLASLt's tensorwise mode runs this decomposition at M = 128).
//               The load counts tokens, so these beat the 128-token tiles where they fill as well
//               with fewer token rows, and at equal load they are taken before the 128x224 tile.
//               M = 112 / 128: N = 6144 (96 wide): 9.3 / 9.1 us against 11.2 / 10.2 for the swapped
//               64x128 default (cuBLASLt tensorwise 10.0 / 9.7); N = 10240 (160): 26.9 / 28.5 (auto
//               26.7 / 27.8) against 28.7 / 28.9 for 128x96 (27.0 / 27.1); N = 28672 (224): 37.8 /
//               38.6 against 38.9 / 39.8 for 128x224 (38.2 / 40.1); N = 57344 (224): 133.9 / 137.6
//               against 140.4 / 144.1 (141.1 / 147.9). Where they fill worse they lose (N = 8192,
//               160 wide: 23.3 against 22.9 for the swapped default at M = 128).
//             - Up to M = 96 only the 224-wide cooperative one: these 128-token tiles then miss 32
//               rows or more, which the 96- and 192-wide ones pay for and the 224-wide one does not (M = 72,
//               N = 10240: 128x96 37.4 us against 32.0 for the swapped 96-token tiles; N = 57344:
//               128x224 135.8 against 150.1). Given rows to spare, they run whole (token_rows).
//             - 64 wide, swapped, one 192-token tile (128 < M <= 192): each weight tile is read by one
//               CTA, once, and the tile multiplies 192 tokens where the 128-token tiles multiply 256.
//               At equal load it is taken before the 96- and 192-wide cooperative tiles, which read
//               each weight tile once per token tile. M = 150 / 176 / 192, A without spare rows:
//               N = 6144: 17.6 / 12.7 / 12.0 us against 20.4 / 18.5 / 17.6 for the tree's choice
//               before (cuBLASLt tensorwise 10.8 / 11.3 / 11.4); 8192 x 8192: 34.9 / 26.3 / 26.1
//               against 40.4 / 35.8 / 33.3 (25.1 / 24.6 / 25.8); 8192 x 28672: 106.9 / 81.8 / 83.4
//               against 123.8 / 116.9 / 111.6; 57344 x 8192: 228.3 / 184.6 / 169.1 against 231.5 /
//               246.0 / 223.5. N = 10240 keeps the 160-wide pairs (one wave against two; 50.3 against
//               44.2 at M = 150), N <= 4096 the swapped 128x64 tiles (4096 x 14336 at M = 176: 31.4
//               against 29.8). With no spare rows M = 136 and 150 still pay for the rows past M
//               (28672 x 4096: 64.8 against 64.3 at M = 150); given them, M = 129 to 168 run whole
//               192-token tiles (token_rows). (Log section "129 to 192 tokens", at its top.)
//             (bench/results/scaled_mm_ab_h200.log, the wave-fit section and the partial token tiles.)
int wave_fit_config(const ScaledMmArgs& a, int sms) {
  if (a.M <= 32 || a.M > 2048 || (a.M > 128 && a.M <= 256 && a.N <= 4096)) return -1;
  struct Candidate {
    ConfigId config;
    bool margin;    // must reach 80 % of the default's load
    bool one_read;  // one token tile covers all of M: taken first at equal load (the others there read
                    // each weight tile once per token tile)
  };
  static constexpr Candidate kOneTokenTile[] = {{kPing64x80, false, false}};
  static constexpr Candidate kPartialTokenTile[] = {{kCoop128x224, false, false}};
  // At equal load the first listed of equal width wins: the 64-token pairs before the 128x224 tile.
  static constexpr Candidate kNarrowM[] = {{kCoop128x96, true, false},          {kCoop128x192, true, false},
                                           {kPing64x96Cluster2, false, false},  {kPing64x160Cluster2, false, false},
                                           {kPing64x224Cluster2, false, false}, {kCoop128x224, false, false}};
  static constexpr Candidate kMidM[] = {
      {kCoop128x96, true, false}, {kCoop128x192, true, false}, {kPing128x160Cluster2, false, false}};
  static constexpr Candidate kMidMOneTile[] = {{kSwap64x192Ping, false, true},
                                               {kCoop128x96, true, false},
                                               {kCoop128x192, true, false},
                                               {kPing128x160Cluster2, false, false}};
  static constexpr Candidate kLargeM[] = {{kPing128x160Cluster2, false, false}};
  // The slowest SM's load in channel rows x token rows: waves x tile width x tile tokens. Tiles of up
  // to 64 tokens count as 64, of up to 128 as 128 (the swapped defaults' 96-token tiles included).
  auto load = [&](int width, int64_t tokens) {
    tokens = tokens <= 64 ? 64 : tokens <= 128 ? 128 : tokens;
    return cdiv(cdiv(a.M, tokens) * cdiv(a.N, width), sms) * width * tokens;
  };
  // The defaults: the swapped 64-row tiles up to M = 128, on 64 tokens up to M = 64 and in pairs of
  // 64-token tiles where those fit (see pick_plan), else on 128; 128 x 128 above.
  const bool default_64_tokens = a.M <= 64 || (a.M > 96 && swapped_pairs_fit(a, sms));
  const int64_t base = a.M > 128 ? load(channel_tile(kPing128x128Cluster2), 128)
                                 : load(channel_tile(kSwap64x64Ping), default_64_tokens ? 64 : 128);
  int best = -1;
  int64_t best_load = 0;
  bool best_one_read = false;
  auto consider = [&](const Candidate& c) {
    const int width = channel_tile(c.config);
    const int64_t l = load(width, token_tile(c.config));
    if (c.margin ? 5 * l > 4 * base : l > base) return;
    bool better = best < 0 || l < best_load;
    if (!better && l == best_load) better = c.one_read != best_one_read ? c.one_read : width > channel_tile(best);
    if (better) {
      best = c.config;
      best_load = l;
      best_one_read = c.one_read;
    }
  };
  if (a.M <= 64) {
    for (const Candidate& c : kOneTokenTile) consider(c);
  } else if (a.M <= 96) {
    for (const Candidate& c : kPartialTokenTile) consider(c);
  } else if (a.M <= 128) {
    for (const Candidate& c : kNarrowM) consider(c);
  } else if (a.M <= kConfigs[kSwap64x192Ping].tile_n) {
    for (const Candidate& c : kMidMOneTile) consider(c);
  } else if (a.M <= 512) {
    for (const Candidate& c : kMidM) consider(c);
  } else {
    for (const Candidate& c : kLargeM) consider(c);
  }
  return best;
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
    p.config = a.M <= 16                  ? kSwap64x16Ping
               : a.M <= 32                ? kSwap64x32Ping
               : a.M <= 64                ? kSwap64x64Ping
               : a.M <= 96                ? kSwap64x96Ping
               : swapped_pairs_fit(a, sms) ? kSwap64x64PingTokenPair
                                          : kSwap64x128Ping;
  } else if (a.M <= 256) {
    if (a.N <= 4096) {
      p.config = a.M > 256 - kMinMissingRows ? kSwap64x128Ping : kSwap128x64Coop;
    } else if (ragged_last_wave) {
      p.config = kCoop128x128;
      p.opts.decomp = Decomp::StreamK;
    } else {
      p.config = kPing128x128Cluster2;
    }
  } else if (a.M >= 8192 && a.K >= 8192) {
    p.config = kCoop128x256Cluster2;
    p.opts.decomp = Decomp::StreamK;
    p.opts.swizzle = 8;
  } else {
    p.config = kPing128x128Cluster2;
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

int64_t token_rows(const ScaledMmArgs& a, int64_t available) {
  const int64_t M = a.M;
  if (M <= 32 || M > 256) return M;
  const int64_t tile128 = token_tile(kSwap64x128Ping);
  const int64_t widest = M <= 64 ? token_tile(kSwap64x64Ping) : cdiv(M, tile128) * tile128;  // 64, 128 or 256
  // For an activation buffer (N unknown): the widest tile any plan for M may run whole, below.
  if (a.N == 0) return M <= 96 && M > 64 ? widest : widest - M >= kMinMissingRows ? widest : M;
  const int sms = a.sm_count > 0 ? a.sm_count : 132;
  ScaledMmArgs q = a;
  q.config = q.decomp = q.splits = q.swizzle = -1;
  SmallMPlan small;
  if (small_m_auto_plan(q, &small)) return M;  // its loads read rows past M as zeros: nothing to gain
  // 96-token plans where a wave-fit config would take 128 whole tokens: run that (M = 80 to 96,
  // N = 10240: 27.3 to 27.5 us against 29.3 to 30.3 on the partial 96-token tiles).
  if (M > 64 && M <= 96 && available >= widest) {
    q.M = widest;
    if (wave_fit_config(q, sms) >= 0) return widest;
    q.M = M;
  }
  const int64_t tile = token_tile(pick_plan(q).config);
  const int64_t whole = cdiv(M, tile) * tile;  // two 64-token tiles for the paired configs
  return whole - M >= kMinMissingRows && whole <= available ? whole : M;
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

int64_t sm90_fp8_token_rows(const ScaledMmArgs& a, int64_t available) { return sm90::token_rows(a, available); }

int sm90_fp8_config_count() { return sm90::kNumConfigs + sm90::kSmallMConfigs; }

const char* sm90_fp8_config_name(int config) {
  if (config >= 0 && config < sm90::kNumConfigs) return sm90::kConfigs[config].name;
  if (config >= sm90::kNumConfigs && config < sm90::kNumConfigs + sm90::kSmallMConfigs)
    return sm90::kSmallMNames[config - sm90::kNumConfigs];
  return nullptr;
}

}  // namespace qb
