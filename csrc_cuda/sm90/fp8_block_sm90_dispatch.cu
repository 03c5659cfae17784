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

// Up to 128 tokens the swapped configs, whose token side covers M so that each weight tile is read
// once: 16-token tiles up to 16 tokens, 32-token tiles where the extra token tiles still fit the
// GPU (up to 64 tokens: one wave; 65 to 128: half a wave of 64-token tiles or less, N = 2112), else
// 64-token tiles. Above 128 tokens 128 x 128 tiles in clusters of two, with the consumer loop that
// promotes one K block under the next block's WGMMAs. Always data-parallel.
// Evidence (H100, bench/results/fp8_block_sm90_h100.log and fp8_block_overlap_h100.log): 32-token
// tiles at M = 64 on 4096 x 4096, 9.6 against 12.3 us with 64-token ones; at M = 128 the swapped
// tiles against 128 x 128: 14.3 against 23.1 us on 2112 x 7168 (32-token), 54.3 against 59.7 on
// 7168 x 18432 (64-token); at M = 4096 the overlapped loop against CUTLASS's x1.06 (24576 x 7168),
// x1.09 (7168 x 18432), x1.02 (8192^3). Stream-K: slower on the first sweep at all but one point,
// faster on two of the four M = 4096 shapes of the second (x1.03, x1.04), slower on the others: not used.
Plan auto_plan(const ScaledMmArgs& a) {
  const int sms = a.sm_count > 0 ? a.sm_count : 132;
  const int64_t weight_tiles = cdiv(a.N, 128);
  Plan p{kBlockOverlap128x128, RunOpts{}};
  if (a.M <= 16) p.config = kBlockSwap128x16;
  else if (a.M <= 32) p.config = kBlockSwap128x32;
  else if (a.M <= 64) p.config = weight_tiles * cdiv(a.M, 32) <= sms ? kBlockSwap128x32 : kBlockSwap128x64;
  else if (a.M <= 128) p.config = 2 * weight_tiles * cdiv(a.M, 64) <= sms ? kBlockSwap128x32 : kBlockSwap128x64;
  p.opts.decomp = Decomp::DataParallel;
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
