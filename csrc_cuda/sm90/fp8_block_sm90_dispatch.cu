// fp8_block_sm90_dispatch.cu: picks the SM90 block-scaled FP8 config and work decomposition.
#include "fp8_block_sm90_configs.h"

namespace qb {
namespace sm90 {
namespace {

using RunFn = int (*)(const ScaledMmArgs&, const RunOpts&, const Err&);
using WsFn = size_t (*)(const ScaledMmArgs&, const RunOpts&);

#define QB_BLOCK_RUN(id, ...) {&block_run_config<id, 0>, &block_run_config<id, 1>},
const RunFn kRun[kNumBlockConfigs][2] = {QB_SM90_FP8_BLOCK_CONFIGS(QB_BLOCK_RUN)};
#undef QB_BLOCK_RUN
#define QB_BLOCK_WS(id, ...) {&block_config_workspace<id, 0>, &block_config_workspace<id, 1>},
const WsFn kWs[kNumBlockConfigs][2] = {QB_SM90_FP8_BLOCK_CONFIGS(QB_BLOCK_WS)};
#undef QB_BLOCK_WS

struct Plan {
  int config;
  RunOpts opts;
};

// Up to 64 tokens: the swapped configs, whose token side covers M, so each weight tile is read
// once; stream-K hands every SM a share of K where the tiles alone would leave SMs idle (4096 x
// 4096 has 32 weight tiles for 132 SMs). Above: 128 x 128 tiles in clusters of two along N (the
// token tile's TMA load is multicast to both), stream-K where the last wave would be mostly empty.
Plan auto_plan(const ScaledMmArgs& a) {
  const int sms = a.sm_count > 0 ? a.sm_count : 132;
  Plan p{kBlock128x128, RunOpts{}};
  if (a.M <= 64) p.config = a.M <= 16 ? kBlockSwap128x16 : a.M <= 32 ? kBlockSwap128x32 : kBlockSwap128x64;
  const auto& c = kBlockConfigs[p.config];
  const int64_t rows = c.swap ? a.N : a.M, cols = c.swap ? a.M : a.N;
  const int64_t tiles = cdiv(rows, c.tile_m) * cdiv(cols, c.tile_n);
  const int64_t waves = cdiv(tiles, sms);
  const double last_wave_fill = double(tiles) / double(waves * sms);
  p.opts.decomp = last_wave_fill < 0.75 ? Decomp::StreamK : Decomp::DataParallel;
  return p;
}

// The automatic plan with any forced choice (qb_scaled_mm_override) applied.
Plan plan_for(const ScaledMmArgs& a) {
  Plan p = auto_plan(a);
  if (a.config >= 0 && a.config < kNumBlockConfigs) p.config = a.config;
  if (a.decomp >= 0 && a.decomp <= 3) p.opts.decomp = static_cast<Decomp>(a.decomp);
  if (a.splits > 0) p.opts.splits = a.splits;
  if (a.swizzle > 0) p.opts.swizzle = a.swizzle;
  p.opts.programmatic = a.programmatic;
  return p;
}

int out_tag(const ScaledMmArgs& a) { return a.out_dtype == QB_F16 ? 1 : 0; }

}  // namespace
}  // namespace sm90

int sm90_fp8_block_scaled_mm(const ScaledMmArgs& args, const Err& err) {
  using namespace sm90;
  if (args.config >= kNumBlockConfigs)
    return err.set(QB_ERR_UNSUPPORTED, "sm90 fp8 block: no config %d (there are %d)", args.config, kNumBlockConfigs);
  Plan p = plan_for(args);
  const int tag = out_tag(args);
  // Without the workspace the split needs, run the same tiles unsplit.
  if (p.opts.decomp != Decomp::DataParallel && kWs[p.config][tag](args, p.opts) > args.workspace_size)
    p.opts.decomp = Decomp::DataParallel;
  return kRun[p.config][tag](args, p.opts, err);
}

size_t sm90_fp8_block_workspace(const ScaledMmArgs& args) {
  using namespace sm90;
  if (args.config >= kNumBlockConfigs) return 0;
  const Plan p = plan_for(args);
  return kWs[p.config][out_tag(args)](args, p.opts);
}

int sm90_fp8_block_config_count() { return sm90::kNumBlockConfigs; }

const char* sm90_fp8_block_config_name(int config) {
  return config >= 0 && config < sm90::kNumBlockConfigs ? sm90::kBlockConfigs[config].name : nullptr;
}

}  // namespace qb
