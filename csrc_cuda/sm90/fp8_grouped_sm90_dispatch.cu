// fp8_grouped_sm90_dispatch.cu: the SM90 grouped FP8 family's config for each request.
#include "fp8_grouped_sm90_configs.h"

namespace qb {
namespace sm90 {
namespace {

using RunFn = int (*)(const GroupedArgs&, int, const Err&);
using WsFn = size_t (*)(const GroupedArgs&, int);

#define QB_GROUPED_RUN(id, ...) {&grouped_run_config<id, 0>, &grouped_run_config<id, 1>},
const RunFn kRun[kNumGroupedConfigs][2] = {QB_SM90_FP8_GROUPED_CONFIGS(QB_GROUPED_RUN)};
#undef QB_GROUPED_RUN
#define QB_GROUPED_WS(id, ...) {&grouped_config_workspace<id, 0>, &grouped_config_workspace<id, 1>},
const WsFn kWs[kNumGroupedConfigs][2] = {QB_SM90_FP8_GROUPED_CONFIGS(QB_GROUPED_WS)};
#undef QB_GROUPED_WS

// The host knows only the total rows and the group count, not how they split. Up to 16 rows per
// group on average (decode, and the prefill of models with many small experts) a swapped config,
// whose 32-token tiles waste little on groups of a few tokens; above, 128 x 128 tiles, and for
// tensor / row / column scales 128 x 256 tiles in pairs of CTAs above kWideRows rows per group.
// Evidence (H100, bench/results/probe_grouped_sm90_h100.txt): on DeepSeek-V3's layers swapped
// faster at 8 rows per group (x1.02, x1.03), 128 x 128 faster at 32 (x1.36, x1.36); on Qwen3's
// and Mixtral's, 128 x 128 faster than 128 x 256 at 64 rows per group (x1.04 to x1.23), 128 x 256
// faster at 256 (x1.21, x1.27 on Mixtral; x0.97, x1.05 on Qwen3) and above.
constexpr int64_t kWideRows = 128;
int auto_config(const GroupedArgs& a) {
  const bool few_rows = a.M <= 16 * a.groups;
  if (a.block_scaled) return few_rows ? kGroupedBlockSwap128x32 : kGroupedBlock128x128;
  if (few_rows) return kGroupedSwap128x32;
  return a.M > kWideRows * a.groups ? kGrouped128x256C2x1 : kGrouped128x128;
}

// The forced config (qb_grouped_scaled_mm_override) if any, else the automatic one; -1 where a
// forced config does not take this call's kind of scales.
int config_for(const GroupedArgs& a) {
  if (a.config < 0) return auto_config(a);
  if (a.config >= kNumGroupedConfigs || kGroupedConfigs[a.config].block != a.block_scaled) return -1;
  return a.config;
}

int out_tag(const GroupedArgs& a) { return a.out_dtype == QB_F16 ? 1 : 0; }

}  // namespace
}  // namespace sm90

int sm90_fp8_grouped_scaled_mm(const GroupedArgs& args, int sm_count, const Err& err) {
  using namespace sm90;
  const int config = config_for(args);
  const char* kinds[2] = {"tensor / row / column", "block"};
  if (args.config >= kNumGroupedConfigs)
    return err.set(QB_ERR_UNSUPPORTED, "sm90 fp8 grouped: no config %d (there are %d)", args.config,
                   kNumGroupedConfigs);
  if (config < 0)
    return err.set(QB_ERR_UNSUPPORTED, "sm90 fp8 grouped: config %d (%s) takes %s scales, this call has %s ones",
                   args.config, kGroupedConfigs[args.config].name, kinds[kGroupedConfigs[args.config].block],
                   kinds[args.block_scaled]);
  return kRun[config][out_tag(args)](args, sm_count, err);
}

size_t sm90_fp8_grouped_workspace(const GroupedArgs& args, int sm_count) {
  using namespace sm90;
  const int config = config_for(args);
  return config < 0 ? 0 : kWs[config][out_tag(args)](args, sm_count);
}

int sm90_fp8_grouped_config_count() { return sm90::kNumGroupedConfigs; }

const char* sm90_fp8_grouped_config_name(int config) {
  return config >= 0 && config < sm90::kNumGroupedConfigs ? sm90::kGroupedConfigs[config].name : nullptr;
}

}  // namespace qb
