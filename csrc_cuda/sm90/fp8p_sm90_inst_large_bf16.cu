// Instantiates the SM90 precise FP8 configs (partial sums promoted into fp32 per 128-deep K
// tile) for more than 64 tokens, bf16 output.
#include "w8a8_sm90_kernel.cuh"

namespace qb::sm90 {
QB_SM90_PLAIN_INSTANTIATE(Mainloop::kFp8Precise, kPlainSwap64x128Ping, 0)
QB_SM90_PLAIN_INSTANTIATE(Mainloop::kFp8Precise, kPlainSwap128x64Coop, 0)
QB_SM90_PLAIN_INSTANTIATE(Mainloop::kFp8Precise, kPlainPing128x128Cluster2, 0)
QB_SM90_PLAIN_INSTANTIATE(Mainloop::kFp8Precise, kPlainCoop128x128Cluster2, 0)
}  // namespace qb::sm90
