// V14: TMA + wgmma (the Hopper line, first step; sm_90a only). V11-V13 multiply with mma.sync, a
// warp at a time, from fragments each warp first copies out of shared memory with ldmatrix. Hopper
// has a warpgroup-wide asynchronous multiply, wgmma, that reads its B operand (and optionally A)
// straight from shared memory through a descriptor, and a copy engine, TMA, that moves a whole
// tile from global to shared memory on one thread's request and signals an mbarrier when the bytes
// have landed. V14 uses both, and nothing else new: no warp specialisation yet, no overlap of
// softmax with the multiplies (V15, V16, V17).
//
//   256 threads = 2 warpgroups, Br = 128 query rows per block, each warpgroup owning 64 of them;
//   Bc = 128 keys per K/V tile, D = 128; grid (S / 128, B*H).
//
//   Shared memory (base aligned to 1024 at run time: the 128-byte swizzle atoms need it)
//     q          [2 halves][128 rows][64]   32 KB   loaded once
//     k[stage]   [2 halves][128 keys][64]   32 KB   x 2 stages (a ring)
//     v[stage]   [2 halves][128 keys][64]   32 KB   x 2 stages
//     barriers   q_full, k_full[2], v_full[2], empty[2]
//   = 160 KB + 56 B; one block per SM.
//   A half is one 128-byte-swizzled TMA box (64 head columns): see hopper.cuh.
//
//   Schedule. Thread 0 (in warpgroup 0) is also the producer: it issues every TMA.
//
//   thread 0 | Q, K0, V0, K1, V1 |           ...  wait empty[s], K(j+2), V(j+2) -> stage s
//   wg 0, 1  | wait Q            | for tile j, stage s = j % 2:
//            |                   |   wait k_full[s]; S = Q K^T (8 wgmma k16, from smem); wait
//            |                   |   online softmax of S in registers; P = fp16(exp(S - max))
//            |                   |   wait v_full[s]; O = O * rescale + P V (8 wgmma, P from
//            |                   |   registers, V from smem); wait; arrive empty[s]
//
//   The K and V of a stage have separate full barriers, so QK of tile j starts as soon as K(j) has
//   landed while V(j) may still be arriving. A stage is refilled once all 256 threads have
//   arrived on its empty barrier (its PV is done); thread 0 waits for that after its own PV, so
//   warpgroup 0 pays for any lag of warpgroup 1 there (V15's producer warp takes this off it).
//
//   Phases: stage s is filled for tiles s, s+2, s+4, ...: the n-th use (n = j / 2) of k_full[s],
//   v_full[s] and empty[s] completes their phase of parity n & 1. q_full completes once (parity 0).
//
//   Per thread: S 64 fp32, O 64 fp32, P 32 x f16x2, rows g and g + 8 of its warp's 16
//   (warp w of a warpgroup holds rows 16w..16w+15 of the warpgroup's 64).
//
// Choice: QK^T and PV each wait for their own wgmma group (wait_group 0) before the softmax, so the
// tensor cores idle during the softmax, as in V11-V13; overlapping them is V16 and V17's job.
// Choice: the producer is thread 0 of the consumer warpgroups (no extra warps), refilling a stage
// as soon as the block is done with it: two tiles of K and V in flight at most.
// Choice: the row sums are kept per thread (its 32 columns of each row) and summed over the quad
// only in the epilogue, as FlashAttention-2 does; the rescale factors are the same in the quad, so
// the sum is unchanged.
// Choice: O is stored with plain 4-byte stores from the accumulator layout (a TMA store is later).
//
#include "hopper.cuh"

using namespace flash;
using namespace flash::hopper;

namespace {

constexpr int kThreads = 256;
constexpr int kWarpgroups = kThreads / 128;
constexpr int kBr = 128;                          // query rows per block
constexpr int kWgRows = kBr / kWarpgroups;        // 64 rows per warpgroup: one wgmma M
constexpr int kBc = 128;                          // keys per K/V tile: one wgmma N (QK)
constexpr int kD = kHeadDim;                      // 128: PV's wgmma N
constexpr int kStages = 2;                        // K/V ring depth
constexpr int kHalves = kD / kBoxCols;            // 2 boxes of 64 head columns per row
static_assert(kWgRows == 64 && kBc == 128 && kD == 128, "the wgmma shapes below are m64n128k16");

struct SharedStorage {
  half q[kHalves][kBr * kBoxCols];
  half k[kStages][kHalves][kBc * kBoxCols];
  half v[kStages][kHalves][kBc * kBoxCols];
  uint64_t q_full;
  uint64_t k_full[kStages];
  uint64_t v_full[kStages];
  uint64_t empty[kStages];
};
static_assert(offsetof(SharedStorage, q) % kAtomBytes == 0 && offsetof(SharedStorage, k) % kAtomBytes == 0 &&
                  offsetof(SharedStorage, v) % kAtomBytes == 0 && (kBc * kBoxRowBytes) % kAtomBytes == 0,
              "every TMA box and wgmma operand starts on a 1024-byte swizzle atom");
constexpr int kQBytes = kBr * kD * sizeof(half);     // 32 KB: the expect-tx count of q_full
constexpr int kTileBytes = kBc * kD * sizeof(half);  // 32 KB: of k_full / v_full
[[maybe_unused]] constexpr int kSmemBytes = sizeof(SharedStorage) + kAtomBytes;  // + slack to align the base

}  // namespace

FLASH_LAUNCH_CONTRACT_TMA(kThreads, kBr, kBc, kSmemBytes, kBr, kBc)

extern "C" __global__ void __launch_bounds__(kThreads, 1)
flash_attention_forward(const half* __restrict__ q, const half* __restrict__ k, const half* __restrict__ v,
                        half* __restrict__ o, int seq_len, float scale_log2, const __grid_constant__ CUtensorMap tmap_q,
                        const __grid_constant__ CUtensorMap tmap_k, const __grid_constant__ CUtensorMap tmap_v) {
  extern __shared__ unsigned char smem_raw[];
  SharedStorage& smem =
      *reinterpret_cast<SharedStorage*>(smem_raw + (kAtomBytes - smem_addr(smem_raw) % kAtomBytes) % kAtomBytes);

  const int thread = threadIdx.x, wg = thread / 128, warp = (thread / 32) % 4, lane = thread % 32;
  const int g = lane / 4, quad = lane % 4;
  const int num_tiles = seq_len / kBc;
  // Rows of the [B*H*S, 128] view the tensor maps describe: this head's first key, this block's Q.
  const int head_row0 = blockIdx.y * seq_len;
  const int q_row0 = head_row0 + blockIdx.x * kBr;

  // The producer's one action: K and V of `tile` into its stage, each half-tile on its barrier.
  const auto issue_kv = [&](int tile) {
    const int stage = tile % kStages;
    mbar_arrive_expect_tx(&smem.k_full[stage], kTileBytes);
    tma_load_tile<kBc>(smem.k[stage][0], &tmap_k, &smem.k_full[stage], head_row0 + tile * kBc);
    mbar_arrive_expect_tx(&smem.v_full[stage], kTileBytes);
    tma_load_tile<kBc>(smem.v[stage][0], &tmap_v, &smem.v_full[stage], head_row0 + tile * kBc);
  };

  // ---- prologue: barriers, then Q and the first kStages tiles of K and V ------------------------
  if (thread == 0) {
    tma_prefetch_map(&tmap_q), tma_prefetch_map(&tmap_k), tma_prefetch_map(&tmap_v);
    mbar_init(&smem.q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&smem.k_full[s], 1);
      mbar_init(&smem.v_full[s], 1);
      mbar_init(&smem.empty[s], kThreads);
    }
    mbar_fence_init();
  }
  __syncthreads();
  if (thread == 0) {
    mbar_arrive_expect_tx(&smem.q_full, kQBytes);
    tma_load_tile<kBr>(smem.q[0], &tmap_q, &smem.q_full, q_row0);
    for (int tile = 0; tile < kStages && tile < num_tiles; ++tile) issue_kv(tile);
  }
  __syncwarp();

  // wgmma descriptors of k-step 0. QK's k-step ks reads head columns 16ks..: box half ks / 4, 32
  // bytes per k-step inside it. PV's k-step kk reads keys 16kk..: 16 rows of 128 bytes further.
  const uint64_t q_desc0 = make_desc_sw128(smem_addr(smem.q[0]) + wg * kWgRows * kBoxRowBytes, 16, kAtomBytes);
  const auto qk_step = [](int ks, int rows) { return (ks / 4) * rows * kBoxRowBytes + (ks % 4) * 32; };

  float o_acc[64];  // O: 64 rows x 128 head columns per warpgroup
#pragma unroll
  for (int i = 0; i < 64; ++i) o_acc[i] = 0.f;
  float row_max[2] = {-INFINITY, -INFINITY};  // rows g, g + 8: running max of the raw scores
  float row_sum[2] = {0.f, 0.f};              // this thread's part of the running sum of exp

  mbar_wait(&smem.q_full, 0);

  for (int tile = 0; tile < num_tiles; ++tile) {
    const int stage = tile % kStages;
    const uint32_t parity = (tile / kStages) & 1;

    // ---- S = Q K^T: 64 rows x 128 keys per warpgroup, 8 wgmma k16 steps over the head dim --------
    float s_acc[64];
    const uint64_t k_desc0 = make_desc_sw128(smem_addr(smem.k[stage][0]), 16, kAtomBytes);
    mbar_wait(&smem.k_full[stage], parity);
    fence_regs(s_acc);
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kD / 16; ++ks)
      wgmma_m64n128k16_ss(s_acc, desc_advance(q_desc0, qk_step(ks, kBr)), desc_advance(k_desc0, qk_step(ks, kBc)),
                          ks > 0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(s_acc);

    // ---- online softmax in registers: a thread holds 32 of the 128 columns of rows g, g + 8 ------
    // (s_acc[4i + 2h + e]: row g + 8h, key 8i + 2*quad + e)
    float rescale[2], neg_max_scaled[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float tile_max = -INFINITY;
#pragma unroll
      for (int i = 0; i < 16; ++i) tile_max = fmaxf(tile_max, fmaxf(s_acc[4 * i + 2 * h], s_acc[4 * i + 2 * h + 1]));
      const float new_max = fmaxf(row_max[h], quad_max(tile_max));
      rescale[h] = fast_exp2((row_max[h] - new_max) * scale_log2);
      row_max[h] = new_max;
      neg_max_scaled[h] = -new_max * scale_log2;
      row_sum[h] *= rescale[h];
    }
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      const int h = (i / 2) % 2;
      s_acc[i] = fast_exp2(fmaf(s_acc[i], scale_log2, neg_max_scaled[h]));
      row_sum[h] += s_acc[i];
      o_acc[i] *= rescale[h];  // O's columns are head dims, its rows the same g, g + 8
    }
    // P as wgmma A fragments: k16 slice kk (keys 16kk..) is accumulator blocks 2kk, 2kk + 1.
    uint32_t p_frag[kBc / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk)
#pragma unroll
      for (int r = 0; r < 4; ++r) p_frag[kk][r] = pack_half2(s_acc[8 * kk + 2 * r], s_acc[8 * kk + 2 * r + 1]);

    // ---- O += P V: 64 rows x 128 head columns, 8 wgmma k16 steps over the keys -------------------
    // V is [keys][head dims]: B = V with N (head dims) contiguous, MN-major; the two 64-column
    // halves are LBO = 128 keys x 128 B apart, 8-key groups SBO = 1024 B apart.
    const uint64_t v_desc0 = make_desc_sw128(smem_addr(smem.v[stage][0]), kBc * kBoxRowBytes, kAtomBytes);
    mbar_wait(&smem.v_full[stage], parity);
    fence_regs(o_acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) wgmma_m64n128k16_rs_bt(o_acc, p_frag[kk], desc_advance(v_desc0, kk * 16 * kBoxRowBytes), 1);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(o_acc);

    // ---- the stage is free: refill it with tile + kStages ----------------------------------------
    mbar_arrive(&smem.empty[stage]);
    if (thread == 0 && tile + kStages < num_tiles) {
      mbar_wait(&smem.empty[stage], parity);
      issue_kv(tile + kStages);
    }
    __syncwarp();  // warp 0 whole again before its next wgmma (.aligned)
  }

  // ---- O / row_sum -> global, fp16 --------------------------------------------------------------
  o += size_t(q_row0 + wg * kWgRows + warp * 16) * kD;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float inv = 1.f / quad_sum(row_sum[h]);
    half* row = o + (g + 8 * h) * kD;
#pragma unroll
    for (int i = 0; i < 16; ++i)
      *reinterpret_cast<uint32_t*>(row + 8 * i + 2 * quad) =
          pack_half2(o_acc[4 * i + 2 * h] * inv, o_acc[4 * i + 2 * h + 1] * inv);
  }
  require_grid_covers(seq_len, kBr, kBc);  // a grid that does not cover S traps: the launch fails loudly
}
