// marlin_host.cuh: the host side of one family (launch configuration, the M-chunk loop, the prepare
// launch), templated on the family's ARCH and included by that family's translation unit only.
#pragma once

#include <cuda_runtime.h>

#include <atomic>

#include "../common/smem_limit.h"
#include "marlin_kernel.cuh"
#include "qbackend_cuda.h"

namespace qbmarlin {
namespace host {

constexpr int kMaxDevices = 64;

// Raise one kernel instance's dynamic shared-memory limit once per device (the record is per
// template instance).
template <int MT, bool BF16, int ARCH, int STAGES>
inline cudaError_t allow_smem(int bytes) {
  static int allowed[qb::kSmemLimitDevices] = {0};
  return qb::allow_dynamic_smem(kern::marlin_mm_kernel<MT, BF16, ARCH, STAGES>, bytes, allowed);
}

// Pipeline depth and resident blocks per multiprocessor for one m16-tile count.
struct LaunchShape {
  int stages;
  int blocks_per_sm;  // wanted (the occupancy query may grant fewer)
};

// Automatic choice, from H200 measurements (bench_marlin.py --tune, M = 1 and 16): two resident
// blocks of 8 warps per multiprocessor with a 3-deep ring stream large weights fastest (28672x4096:
// 34.1 us against 38.1 with one block; 57344x8192: 111.6 against 123.0), while up to about 8192x8192
// (4096 tiles) one block wins: 4096x4096 10.7 against 12.4 us, 4096x14336 21.0 / 21.4 against
// 21.7 / 23.9 (M = 1 / 16), 8192x8192 level at M = 1 and 22.6 against 23.8 at M = 16. Its ring depth
// matters little (within 2 % from 3 to 8). Two blocks are used when each would still get >= 18
// tiles (units >= 36 * SMs; 10240x8192, 5120 tiles, stays on two: 27.5 us). (Those figures predate
// the split-K hand-over at the end of each run; a sweep of the current kernel, bench/probe_marlin.py
// at M = 1, keeps the same choices: 28672x4096 32.1 us on two blocks against 37.1, 57344x8192
// 115.5 against 126.3, 4096x4096 9.4 on one against 10.4, 10240x8192 26.9 on two against 27.3.)
constexpr int kTwoBlocksMinTilesPerBlock = 18;

// A block's run of `per` tiles is aligned with the columns when per divides KT (each column is split
// into whole runs) or KT divides per (runs of whole columns). A misaligned run ends two segments,
// and the first one's split-K hand-over (reduction barriers, partial sums, counter) stalls the
// block's stream midway. Rounding the run up to the next aligned length is worth up to
// kAlignSlackTiles more tiles per block (H200, M = 1: 6144x4096 12 -> 16 tiles, 14.6 -> 13.8 us;
// 28672x4096 28 -> 32, which needs no split-K at all, 33.8 -> 31.7 us; 8192x28672 55 -> 56,
// 61.3 -> 59.4 us; not worth it at 57344x8192, 109 -> 128 tiles, 111 -> 116 us, nor at 10240x8192,
// 20 -> 32 tiles, 27.5 -> 32.5 us).
constexpr int kAlignSlackTiles = 4;

inline int aligned_run(int per, int KT) {
  int a = per;
  if (per >= KT) {
    a = static_cast<int>(cdiv(per, KT)) * KT;
  } else {
    while (KT % a != 0) ++a;  // terminates at KT at the latest
  }
  return a - per <= kAlignSlackTiles ? a : per;
}

// One block per multiprocessor can also leave many of them idle: where the aligned run is much
// longer than an even share, cdiv(units, run) blocks fall well short of the SM count (6144x4096:
// 16-tile runs fill 96 of 132). Two blocks then deal shorter runs over all of them (8-tile runs,
// 192 blocks): H200, bench/probe_marlin.py sweep, M = 1 / 16: 12.2 / 12.4 us against 13.1 / 13.2.
// Not where one block fills at least 7/8 of the SMs (4096x4096: 128 of 132 blocks; 9.4 against
// 10.4 us with two).
inline bool one_block_underfills(int units, int KT, int sm_count) {
  if (units < 4 * sm_count) return false;  // too little work for the second block to matter
  const int per = aligned_run(static_cast<int>(cdiv(units, sm_count)), KT);
  return cdiv(units, per) * 8 < 7 * static_cast<int64_t>(sm_count);
}

template <int ARCH>
inline LaunchShape launch_shape(int MT, int units, int KT, const MmArgs& a) {
  const int stage = kTileBytes + MT * 16 * kTileK * 2;
  const int kernel_min_blocks = (ARCH >= 80 && MT == 1) ? 2 : 1;  // = kern::Occupancy<MT, ARCH>::kMinBlocks
  const bool big = units >= kTwoBlocksMinTilesPerBlock * kMaxBlocksPerSm * a.sm_count;
  const bool two = big || one_block_underfills(units, KT, a.sm_count);
  int bps = a.blocks_per_sm > 0 ? a.blocks_per_sm : (two ? kernel_min_blocks : 1);
  if (bps > kMaxBlocksPerSm) bps = kMaxBlocksPerSm;
  if (ARCH < 80) return {2, bps};
  int s = a.stages > 0 ? a.stages : (bps >= 2 ? 3 : (MT == 1 ? 4 : MT == 2 ? 6 : MT == 3 ? 5 : 4));
  if (s > 12) s = 12;
  // per-block budget: the opt-in limit, and with several blocks their share of the multiprocessor
  int budget = a.smem_optin;
  if (bps > 1 && a.smem_per_sm > 0) {
    const int share = a.smem_per_sm / bps - 1024 - 256;  // 1 KiB reserved per block, static smem
    if (share < budget) budget = share;
  }
  while (s > 2 && s * stage > budget) --s;
  return {s < 2 ? 2 : s, bps};
}

template <int ARCH>
inline int max_rows(int units, int KT, const MmArgs& a) {
  for (int mt = 4; mt > 1; --mt) {
    const LaunchShape ls = launch_shape<ARCH>(mt, units, KT, a);
    if (ls.stages * (kTileBytes + mt * 16 * kTileK * 2) + 256 <= a.smem_optin) return 16 * mt;
  }
  return 16;
}

// Resident blocks per multiprocessor for this kernel instance and shared-memory size (cached per
// device: the query is host-only but not free). The size and the count are one atomic 64-bit word
// (smem << 32 | count), so a thread never reads one call's size with another call's count.
template <int MT, bool BF16, int ARCH, int STAGES>
inline int resident_blocks(int smem, int* out) {
  static std::atomic<unsigned long long> cached[kMaxDevices];  // zero-initialized (static storage)
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const bool cache = dev >= 0 && dev < kMaxDevices;
  if (cache) {
    const unsigned long long v = cached[dev].load(std::memory_order_relaxed);
    if (int(v >> 32) == smem && int(v & 0xffffffffu) > 0) {
      *out = int(v & 0xffffffffu);
      return cudaSuccess;
    }
  }
  int occ = 0;
  e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, kern::marlin_mm_kernel<MT, BF16, ARCH, STAGES>, kThreads,
                                                    smem);
  if (e != cudaSuccess) return e;
  if (occ < 1) occ = 1;
  if (cache) cached[dev].store((static_cast<unsigned long long>(unsigned(smem)) << 32) | unsigned(occ),
                               std::memory_order_relaxed);
  *out = occ;
  return cudaSuccess;
}

template <int MT, bool BF16, int ARCH, int STAGES>
inline int launch_at(const kern::Params& prm, const MmArgs& a, const LaunchShape& ls, char* err, size_t err_len) {
  const int smem = ls.stages * kern::Shape<MT>::kStageBytes;
  cudaError_t e = allow_smem<MT, BF16, ARCH, STAGES>(smem);
  if (e != cudaSuccess)
    return set_err(err, err_len, QB_ERR_CUDA, "marlin sm%d: cudaFuncSetAttribute(%d bytes of shared memory): %s: %s",
                   ARCH, smem, cudaGetErrorName(e), cudaGetErrorString(e));
  int occ = 1;
  e = static_cast<cudaError_t>(resident_blocks<MT, BF16, ARCH, STAGES>(smem, &occ));
  if (e != cudaSuccess)
    return set_err(err, err_len, QB_ERR_CUDA, "marlin sm%d: occupancy query: %s: %s", ARCH, cudaGetErrorName(e),
                   cudaGetErrorString(e));
  const int bps = occ < ls.blocks_per_sm ? occ : ls.blocks_per_sm;
  int g = bps * a.sm_count;
  if (g > a.max_grid) g = a.max_grid;
  if (g < 1) g = 1;
  kern::Params q = prm;
  q.per = aligned_run(static_cast<int>(cdiv(prm.units, g)), prm.KT);
  const int grid = static_cast<int>(cdiv(prm.units, q.per));
  q.stages = ls.stages;
  kern::marlin_mm_kernel<MT, BF16, ARCH, STAGES><<<grid, kThreads, smem, a.stream>>>(q);
  e = cudaGetLastError();
  if (e != cudaSuccess)
    return set_err(err, err_len, QB_ERR_CUDA, "marlin sm%d kernel launch (M tile %d, %s, grid %d, smem %d): %s: %s",
                   ARCH, MT * 16, BF16 ? "bf16" : "fp16", grid, smem, cudaGetErrorName(e), cudaGetErrorString(e));
  return QB_OK;
}

// One m16 tile runs with its ring depth built in where the automatic choice takes it: 3 with two
// blocks per multiprocessor (2 where a multiprocessor has 100 KiB, sm_86 and sm_89), 4 with one.
// Forced depths, and more tiles, run the kernel that reads the depth at run time.
template <int MT, bool BF16, int ARCH>
inline int launch(const kern::Params& prm, const MmArgs& a, char* err, size_t err_len) {
  const LaunchShape ls = launch_shape<ARCH>(MT, prm.units, prm.KT, a);
  if constexpr (ARCH >= 80 && MT == 1) {
    switch (ls.stages) {
      case 2: return launch_at<MT, BF16, ARCH, 2>(prm, a, ls, err, err_len);
      case 3: return launch_at<MT, BF16, ARCH, 3>(prm, a, ls, err, err_len);
      case 4: return launch_at<MT, BF16, ARCH, 4>(prm, a, ls, err, err_len);
      default: break;
    }
  }
  return launch_at<MT, BF16, ARCH, 0>(prm, a, ls, err, err_len);
}

template <int ARCH>
inline int run_mm(const MmArgs& a, char* err, size_t err_len) {
  if (ARCH < 80 && a.bf16)
    return set_err(err, err_len, QB_ERR_UNSUPPORTED,
                   "marlin sm75: bf16 activations are not supported (sm_75 tensor cores have no bf16 MMA, and "
                   "converting bf16 to fp16 would overflow above 65504); use fp16 activations or the sm80 variant");
  const int NT = static_cast<int>(cdiv(a.N, kTileN));
  const int KT = static_cast<int>(cdiv(a.K, kTileK));
  const int rows = max_rows<ARCH>(NT * KT, KT, a);

  kern::Params prm{};
  prm.lda_bytes = a.lda * 2;
  prm.w = a.w;
  prm.ldo_bytes = a.ldo * 2;
  prm.N = a.N;
  prm.K = a.K;
  prm.KT = KT;
  prm.units = NT * KT;
  prm.scale = a.scale;
  prm.scale_per_col = a.scale_per_col ? 1 : 0;
  prm.bias = static_cast<const uint8_t*>(a.bias);
  prm.partials = a.partials;
  prm.counters = a.counters;

  for (int64_t m0 = 0; m0 < a.M; m0 += rows) {
    const int mc = static_cast<int>(a.M - m0 < rows ? a.M - m0 : rows);
    const int MT = (mc + 15) / 16;
    prm.a = static_cast<const uint8_t*>(a.a) + m0 * prm.lda_bytes;
    prm.out = static_cast<uint8_t*>(a.out) + m0 * prm.ldo_bytes;
    prm.M = mc;
    int rc;
    if constexpr (ARCH >= 80) {
      if (a.bf16) {
        switch (MT) {
          case 1: rc = launch<1, true, ARCH>(prm, a, err, err_len); break;
          case 2: rc = launch<2, true, ARCH>(prm, a, err, err_len); break;
          case 3: rc = launch<3, true, ARCH>(prm, a, err, err_len); break;
          default: rc = launch<4, true, ARCH>(prm, a, err, err_len); break;
        }
      } else {
        switch (MT) {
          case 1: rc = launch<1, false, ARCH>(prm, a, err, err_len); break;
          case 2: rc = launch<2, false, ARCH>(prm, a, err, err_len); break;
          case 3: rc = launch<3, false, ARCH>(prm, a, err, err_len); break;
          default: rc = launch<4, false, ARCH>(prm, a, err, err_len); break;
        }
      }
    } else {
      switch (MT) {
        case 1: rc = launch<1, false, ARCH>(prm, a, err, err_len); break;
        case 2: rc = launch<2, false, ARCH>(prm, a, err, err_len); break;
        case 3: rc = launch<3, false, ARCH>(prm, a, err, err_len); break;
        default: rc = launch<4, false, ARCH>(prm, a, err, err_len); break;
      }
    }
    if (rc != QB_OK) return rc;
  }
  return QB_OK;
}

template <int ARCH>
inline int run_prepare(const void* w, int64_t ldw, int N, int K, bool bf16, void* packed, int32_t* nan_count,
                       cudaStream_t stream, char* err, size_t err_len) {
  const int64_t NT = cdiv(N, kTileN), KT = cdiv(K, kTileK);
  const int64_t words = NT * KT * (kTileBytes / 4);
  const int64_t blocks = cdiv(words, 256);
  if (blocks > 0x7FFFFFFF) return set_err(err, err_len, QB_ERR_INVALID_ARGUMENT, "marlin prepare: weight too large");
  auto* kernel = bf16 ? kern::marlin_prepare_kernel<ARCH, true> : kern::marlin_prepare_kernel<ARCH, false>;
  kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(static_cast<const uint8_t*>(w), ldw, N, K,
                                                             static_cast<int>(KT), static_cast<uint32_t*>(packed),
                                                             words, nan_count);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return set_err(err, err_len, QB_ERR_CUDA, "marlin prepare kernel launch: %s: %s", cudaGetErrorName(e),
                   cudaGetErrorString(e));
  return QB_OK;
}

template <int ARCH>
inline int run_unpack(const void* packed, int N, int K, bool bf16, const float* scale, bool scale_per_col, void* out,
                      int64_t ldo, cudaStream_t stream, char* err, size_t err_len) {
  const int64_t NT = cdiv(N, kTileN), KT = cdiv(K, kTileK);
  const int64_t words = NT * KT * (kTileBytes / 4);
  const int64_t blocks = cdiv(words, 256);
  if (blocks > 0x7FFFFFFF) return set_err(err, err_len, QB_ERR_INVALID_ARGUMENT, "marlin unpack: weight too large");
  auto* kernel = bf16 ? kern::marlin_unpack_kernel<ARCH, true> : kern::marlin_unpack_kernel<ARCH, false>;
  kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(static_cast<const uint32_t*>(packed), N, K,
                                                             static_cast<int>(KT), words, scale, scale_per_col,
                                                             static_cast<uint32_t*>(out), ldo / 2);
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return set_err(err, err_len, QB_ERR_CUDA, "marlin unpack kernel launch: %s: %s", cudaGetErrorName(e),
                   cudaGetErrorString(e));
  return QB_OK;
}

}  // namespace host
}  // namespace qbmarlin
