// plain_sm90_dispatch.cu: picks the config and work decomposition of the SM90 kernels on the plain
// mainloops (plain_sm90_configs.h): INT8, and precise FP8 (accumulate="precise"). One plan for both.
//
// The buckets are the FP8 family's main ones (fp8_sm90_dispatch.cu says why each was chosen on the
// H200): the tiles are the same size in bytes and the s8 and e4m3 WGMMA rates are equal, so what
// decided them (how often each weight tile is read, how full the last wave is, how many token rows
// a tile fills with zeros) decides here the same way.
//   M <= 16     swapped 64x16 ping-pong: the tokens on the tile's narrow side, each weight tile read
//               by one CTA, once;
//   M <= 64     swapped 64x64 ping-pong (the same, 64 tokens);
//   M <= 128    swapped 64x128 ping-pong;
//   M <= 256    with N <= 4096: swapped 128x64 cooperative, or swapped 64x128 ping-pong where two
//               128-token tiles leave fewer than 24 rows empty;
//   otherwise   128x128 tiles in 2x1 clusters, swizzle 8 from M = 4096 and N = 8192 (tiles that
//               share A and B rows run close together, so those rows stay in L2): ping-pong for INT8,
//               cooperative for precise FP8. A ping-pong consumer holds the whole 128x128 fp32 tile
//               (128 registers a thread), and the promoting mainloop a second copy of it: that spills,
//               and ran x3.4 to x4.4 the time of the fast kernels at M = 4096 on an H100
//               (bench/results/accumulate_h100_pingpong.log). Cooperative halves it per warp group.
// Always data-parallel unless forced (qb_scaled_mm_override): stream-K's partial tiles did not pay
// at these buckets for FP8.
#include "plain_sm90_configs.h"

namespace qb {
namespace sm90 {
namespace {

using RunFn = int (*)(const ScaledMmArgs&, const RunOpts&, const Err&);
using WsFn = size_t (*)(const ScaledMmArgs&, const RunOpts&);

// [mainloop: 0 INT8, 1 precise FP8][config][output: 0 bf16, 1 fp16]
#define QB_PLAIN_RUN(main, id) {&plain_run_config<main, id, 0>, &plain_run_config<main, id, 1>},
#define QB_PLAIN_RUN_I8(id, ...) QB_PLAIN_RUN(Mainloop::kInt8, id)
#define QB_PLAIN_RUN_F8(id, ...) QB_PLAIN_RUN(Mainloop::kFp8Precise, id)
const RunFn kRun[2][kNumPlainConfigs][2] = {{QB_SM90_PLAIN_CONFIGS(QB_PLAIN_RUN_I8)},
                                            {QB_SM90_PLAIN_CONFIGS(QB_PLAIN_RUN_F8)}};
#undef QB_PLAIN_RUN_F8
#undef QB_PLAIN_RUN_I8
#undef QB_PLAIN_RUN
#define QB_PLAIN_WS(main, id) {&plain_config_workspace<main, id, 0>, &plain_config_workspace<main, id, 1>},
#define QB_PLAIN_WS_I8(id, ...) QB_PLAIN_WS(Mainloop::kInt8, id)
#define QB_PLAIN_WS_F8(id, ...) QB_PLAIN_WS(Mainloop::kFp8Precise, id)
const WsFn kWs[2][kNumPlainConfigs][2] = {{QB_SM90_PLAIN_CONFIGS(QB_PLAIN_WS_I8)},
                                          {QB_SM90_PLAIN_CONFIGS(QB_PLAIN_WS_F8)}};
#undef QB_PLAIN_WS_F8
#undef QB_PLAIN_WS_I8
#undef QB_PLAIN_WS

struct Plan {
  int config;
  RunOpts opts;
};

Plan auto_plan(const ScaledMmArgs& a) {
  Plan p{kPlainPing128x128Cluster2, RunOpts{}};
  if (a.M <= 16) p.config = kPlainSwap64x16Ping;
  else if (a.M <= 64) p.config = kPlainSwap64x64Ping;
  else if (a.M <= 128) p.config = kPlainSwap64x128Ping;
  else if (a.M <= 256 && a.N <= 4096) p.config = a.M > 256 - kMinMissingRows ? kPlainSwap64x128Ping : kPlainSwap128x64Coop;
  else if (a.M >= 4096 && a.N >= 8192) p.opts.swizzle = 8;
  if (p.config == kPlainPing128x128Cluster2 && a.a_dtype == QB_E4M3) p.config = kPlainCoop128x128Cluster2;
  return p;
}

// The automatic plan with any forced choice (qb_scaled_mm_override) applied; decompositions other
// than data-parallel only for the cooperative (stream-K scheduler) configs.
Plan plan_for(const ScaledMmArgs& a) {
  Plan p = auto_plan(a);
  if (a.config >= 0 && a.config < kNumPlainConfigs && a.config != p.config) {
    p.config = a.config;
    p.opts = RunOpts{};
  }
  if (a.swizzle > 0) p.opts.swizzle = a.swizzle;
  if (a.decomp >= 0 && a.decomp <= 3) {
    p.opts.decomp = static_cast<Decomp>(a.decomp);
    if (p.opts.decomp == Decomp::SplitK) p.opts.splits = a.splits > 1 ? a.splits : 2;
  }
  if (!kPlainConfigs[p.config].streamk) p.opts.decomp = Decomp::DataParallel;
  return p;
}

int out_tag(const ScaledMmArgs& a) { return a.out_dtype == QB_F16 ? 1 : 0; }

// 0: INT8, 1: precise FP8 (the first index of kRun / kWs).
int mainloop_of(const ScaledMmArgs& a) { return a.a_dtype == QB_I8 ? 0 : 1; }

}  // namespace
}  // namespace sm90

int sm90_plain_scaled_mm(const ScaledMmArgs& args, const Err& err) {
  using namespace sm90;
  if (args.config >= kNumPlainConfigs)
    return err.set(QB_ERR_INVALID_ARGUMENT, "sm90 %s: config %d out of range (%d configs)",
                   args.a_dtype == QB_I8 ? "int8" : "precise fp8", args.config, kNumPlainConfigs);
  Plan p = plan_for(args);
  const int main = mainloop_of(args), tag = out_tag(args);
  // Without the workspace a split needs, run the same tiles unsplit.
  if (p.opts.decomp != Decomp::DataParallel) {
    const size_t need = kWs[main][p.config][tag](args, p.opts);
    if (need > 0 && (args.workspace == nullptr || args.workspace_size < need)) p.opts.decomp = Decomp::DataParallel;
  }
  // Programmatic launch only for data-parallel runs (as for FP8: a split's workspace is reset by a
  // separate operation just before it, which must stay an ordinary stream dependency).
  p.opts.programmatic = args.programmatic && p.opts.decomp == Decomp::DataParallel;
  return kRun[main][p.config][tag](args, p.opts, err);
}

size_t sm90_plain_workspace(const ScaledMmArgs& args) {
  using namespace sm90;
  if (args.config >= kNumPlainConfigs) return 0;
  const Plan p = plan_for(args);
  return kWs[mainloop_of(args)][p.config][out_tag(args)](args, p.opts);
}

int sm90_plain_config_count() { return sm90::kNumPlainConfigs; }

const char* sm90_plain_config_name(int config) {
  return config >= 0 && config < sm90::kNumPlainConfigs ? sm90::kPlainConfigs[config].name : nullptr;
}

}  // namespace qb
