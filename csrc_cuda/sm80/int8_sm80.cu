// int8_sm80.cu: the SM80 INT8 family's entry points (config choice; kernels in int8_sm80_{bf16,f16}.cu).
#include "int8_sm80_family.cuh"

namespace qb {

int sm80_int8_scaled_mm(const ScaledMmArgs& a, const Err& err) { return c2x::dispatch<sm80::Int8Family>(a, err); }
size_t sm80_int8_workspace(const ScaledMmArgs& a) { return c2x::dispatch_workspace<sm80::Int8Family>(a); }
int sm80_int8_config_count() { return sm80::Int8Family::kNumConfigs; }
const char* sm80_int8_config_name(int c) {
  return c >= 0 && c < sm80::Int8Family::kNumConfigs ? sm80::Int8Family::kNames[c] : nullptr;
}

}  // namespace qb
