// fp8_grouped_sm90_dispatch.cu: which SM90 grouped block-scaled FP8 requests this family takes, and
// its config for each.
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
// group on average (decode, and the prefill of models with many small experts) the swapped config,
// whose 32-token tiles waste little on groups of a few tokens; above, 128 x 128 tiles.
// Evidence (H100, DeepSeek-V3's layers, bench/results/probe_grouped_sm90_h100.txt): swapped faster
// at 8 rows per group (x1.03, x1.05), 128 x 128 faster at 32 (x1.34, x1.37).
int config_for(const GroupedArgs& a) {
  if (a.config >= 0 && a.config < kNumGroupedConfigs) return a.config;
  return a.M <= 16 * a.groups ? kGroupedSwap128x32 : kGrouped128x128;
}

int out_tag(const GroupedArgs& a) { return a.out_dtype == QB_F16 ? 1 : 0; }

}  // namespace
}  // namespace sm90

bool sm90_fp8_grouped_supports(const GroupedArgs& args) { return args.block_scaled && args.bias == nullptr; }

int sm90_fp8_grouped_scaled_mm(const GroupedArgs& args, int sm_count, const Err& err) {
  using namespace sm90;
  if (args.config >= kNumGroupedConfigs)
    return err.set(QB_ERR_UNSUPPORTED, "sm90 fp8 grouped: no config %d (there are %d)", args.config,
                   kNumGroupedConfigs);
  if (!sm90_fp8_grouped_supports(args))
    return err.set(QB_ERR_UNSUPPORTED, "sm90 fp8 grouped: takes block scales without bias only (the sm89 family "
                   "takes the rest)");
  return kRun[config_for(args)][out_tag(args)](args, sm_count, err);
}

size_t sm90_fp8_grouped_workspace(const GroupedArgs& args, int sm_count) {
  using namespace sm90;
  if (args.config >= kNumGroupedConfigs || !sm90_fp8_grouped_supports(args)) return 0;
  return kWs[config_for(args)][out_tag(args)](args, sm_count);
}

int sm90_fp8_grouped_config_count() { return sm90::kNumGroupedConfigs; }

const char* sm90_fp8_grouped_config_name(int config) {
  return config >= 0 && config < sm90::kNumGroupedConfigs ? sm90::kGroupedConfigNames[config] : nullptr;
}

}  // namespace qb
