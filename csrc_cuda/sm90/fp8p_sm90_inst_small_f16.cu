// Instantiates the SM90 precise FP8 configs (partial sums promoted into fp32 per 128-deep K
// tile) for up to 64 tokens, f16 output.
#include "w8a8_sm90_kernel.cuh"

namespace qb::sm90 {
QB_SM90_PLAIN_INSTANTIATE(Mainloop::kFp8Precise, kPlainSwap64x16Ping, 1)
QB_SM90_PLAIN_INSTANTIATE(Mainloop::kFp8Precise, kPlainSwap64x64Ping, 1)
}  // namespace qb::sm90
