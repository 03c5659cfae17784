// Instantiates the SM90 INT8 configs for more than 64 tokens, bf16 output.
#include "w8a8_sm90_kernel.cuh"

namespace qb::sm90 {
QB_SM90_PLAIN_INSTANTIATE(Mainloop::kInt8, kPlainSwap64x128Ping, 0)
QB_SM90_PLAIN_INSTANTIATE(Mainloop::kInt8, kPlainSwap128x64Coop, 0)
QB_SM90_PLAIN_INSTANTIATE(Mainloop::kInt8, kPlainPing128x128Cluster2, 0)
QB_SM90_PLAIN_INSTANTIATE(Mainloop::kInt8, kPlainCoop128x128Cluster2, 0)
}  // namespace qb::sm90
