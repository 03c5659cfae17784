// int8_sm75.cu: the SM75 INT8 family's entry points (config choice; kernels in int8_sm75_{bf16,f16}.cu).
#include "int8_sm75_family.cuh"

namespace qb {

int sm75_int8_scaled_mm(const ScaledMmArgs& a, const Err& err) { return c2x::dispatch<sm75::Int8Family>(a, err); }
size_t sm75_int8_workspace(const ScaledMmArgs& a) { return c2x::dispatch_workspace<sm75::Int8Family>(a); }
int sm75_int8_config_count() { return sm75::Int8Family::kNumConfigs; }
const char* sm75_int8_config_name(int c) {
  return c >= 0 && c < sm75::Int8Family::kNumConfigs ? sm75::Int8Family::kNames[c] : nullptr;
}

}  // namespace qb
