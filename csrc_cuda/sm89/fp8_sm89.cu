// fp8_sm89.cu: the SM89 FP8 family's entry points (config choice; kernels in fp8_sm89_{bf16,f16}.cu).
#include "fp8_sm89_family.cuh"

namespace qb {

int sm89_fp8_scaled_mm(const ScaledMmArgs& a, const Err& err) { return c2x::dispatch<sm89::Fp8Family>(a, err); }
size_t sm89_fp8_workspace(const ScaledMmArgs& a) { return c2x::dispatch_workspace<sm89::Fp8Family>(a); }
int sm89_fp8_config_count() { return sm89::Fp8Family::kNumConfigs; }
const char* sm89_fp8_config_name(int c) {
  return c >= 0 && c < sm89::Fp8Family::kNumConfigs ? sm89::Fp8Family::kNames[c] : nullptr;
}

}  // namespace qb
