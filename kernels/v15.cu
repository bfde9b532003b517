// V15: producer/consumer warp specialisation with setmaxnreg (the Hopper line, second step; sm_90a
// only). In V14 thread 0 of the first consumer warpgroup also issued every TMA, and to refill a
// stage it waited on the stage's empty barrier after its own PV: warpgroup 0 paid for any lag of
// warpgroup 1, and the ring was refilled only as fast as that thread came round. V15 gives the
// loads a warpgroup of their own, as FlashAttention-3 does: a producer that does nothing but wait
// for a free stage and issue TMA into it, and two consumer warpgroups that only wait for full
// stages, multiply, and hand the stages back. Registers move from the producer to the consumers
// with setmaxnreg (the producer needs a few dozen, the consumers all they can get). The multiplies
// and the softmax are V14's, unchanged: every wgmma is still waited for right away (V16, V17).
//
//   384 threads = 3 warpgroups, __launch_bounds__(384, 1): 65536 / 384 -> 168 registers each at
//   launch; then the producer drops to 24 and the consumers rise to 240 (128 x 24 + 256 x 240 =
//   64512 <= 65536).
//     warpgroup 0      the producer: one thread (lane 0 of its warp 0) issues every TMA, the other
//                      127 threads have nothing to do and leave
//     warpgroups 1, 2  the consumers: consumer warpgroup c = 0, 1 owns query rows 64c..64c+63
//   Br = 128 query rows per block, Bc = 128 keys per K/V tile, D = 128; grid (S / 128, B*H).
//
//   Shared memory (base aligned to 1024 at run time: the 128-byte swizzle atoms need it)
//     q          [2 halves][128 rows][64]   32 KB   loaded once
//     k[stage]   [2 halves][128 keys][64]   32 KB   x 3 stages (a ring)
//     v[stage]   [2 halves][128 keys][64]   32 KB   x 3 stages
//     barriers   q_full, k_full[3], v_full[3], k_empty[3], v_empty[3]   104 B
//   = 224 KB + 104 B, + 1 KB of alignment slack = 230504 B of the 232448 B (227 KB) a block may
//   opt in to on sm_90: the third stage fits, a fourth (64 KB more) does not.
//   A half is one 128-byte-swizzled TMA box (64 head columns): see hopper.cuh.
//
//   Schedule (stage s = j % 3, its n-th use n = j / 3):
//
//   producer  | Q, K0, V0, K1, V1, K2, V2 | for j = 3, 4, ...: wait k_empty[s] (QK of j - 3 done),
//   (1 thread)|                           |   K(j) -> s; wait v_empty[s] (PV of j - 3 done), V(j) -> s
//   consumer  | wait Q                    | for tile j:
//   wg 0, 1   |                           |   wait k_full[s]; S = Q K^T (8 wgmma k16); wait;
//             |                           |   arrive k_empty[s]
//             |                           |   online softmax of S in registers; P = fp16(exp(S - max))
//             |                           |   wait v_full[s]; O = O * rescale + P V (8 wgmma, P from
//             |                           |   registers); wait; arrive v_empty[s]
//
//   K and V of a stage are handed back separately: K as soon as both consumer warpgroups' QK of the
//   tile is done, V after their PV. So K(j + 3) is on its way while the softmax and PV of tile j
//   run, and up to three tiles of K and V are in flight or resident.
//
//   Phases: the n-th use of a stage completes the n-th phase of its four barriers, parity n & 1.
//   The consumers wait on k_full[s], v_full[s] for parity n & 1; before the n-th fill (n >= 1) the
//   producer waits on k_empty[s], v_empty[s] for the phase of the (n - 1)-th use, parity (n - 1) & 1.
//   q_full completes once (parity 0). The producer and consumers each keep (stage, phase) as
//   counters that wrap, rather than dividing by 3.
//
//   Arrival counts: a full barrier completes on the producer's one arrive.expect_tx plus the 32 KB
//   of its tile; an empty barrier on one arrival per consumer warp (8): lane 0 arrives after the
//   warp's wgmma.wait_group, an .aligned instruction the whole warp has passed, and since all 4
//   warps of both consumer warpgroups arrive, every wgmma that read the stage is complete.
//   wgmma and TMA both access shared memory through the async proxy, and the consumers never
//   write the K and V buffers: an empty barrier needs no fence.proxy.async.
//
//   Per consumer thread: S 64 fp32, O 64 fp32, P 32 x f16x2, rows g and g + 8 of its warp's 16
//   (warp w of a warpgroup holds rows 16w..16w+15 of the warpgroup's 64).
//
// Choice: 24 registers for the producer, 240 for each consumer thread (FlashAttention-3's split for
// two consumer warpgroups): the producer's loop holds a few counters and addresses; the consumers
// hold S, O and P (160) with room for the softmax's temporaries.
// Choice: the roles are the two branches of one if/else on the warpgroup index, each starting with
// its setmaxnreg (a warpgroup-wide .aligned instruction): the compiler sees each branch's register
// budget from the start of it. Nothing after the split synchronises the whole block (the idle
// producer threads have left): the consumers meet only on mbarriers.
// Choice: the producer issues tiles in order, K before V, waiting for each buffer just before it
// fills it: K(j) does not wait for V(j - 3) to be free.
// Choice: as in V14, the row sums are kept per thread and summed over the quad in the epilogue, and
// O is stored with plain 4-byte stores from the accumulator layout.
//
#include "hopper.cuh"

using namespace flash;
using namespace flash::hopper;

namespace {

constexpr int kThreads = 384;
constexpr int kConsumerWarpgroups = 2;
constexpr int kConsumerWarps = kConsumerWarpgroups * 4;  // the arrival count of an empty barrier
constexpr int kProducerRegs = 24;                      // setmaxnreg.dec of warpgroup 0
constexpr int kConsumerRegs = 240;                     // setmaxnreg.inc of warpgroups 1, 2
static_assert(128 * kProducerRegs + 128 * kConsumerWarpgroups * kConsumerRegs <= 65536, "the register file");
constexpr int kBr = 128;                               // query rows per block
constexpr int kWgRows = kBr / kConsumerWarpgroups;     // 64 rows per consumer warpgroup: one wgmma M
constexpr int kBc = 128;                               // keys per K/V tile: one wgmma N (QK)
constexpr int kD = kHeadDim;                           // 128: PV's wgmma N
constexpr int kStages = 3;                             // K/V ring depth
constexpr int kHalves = kD / kBoxCols;                 // 2 boxes of 64 head columns per row
static_assert(kWgRows == 64 && kBc == 128 && kD == 128, "the wgmma shapes below are m64n128k16");

struct SharedStorage {
  half q[kHalves][kBr * kBoxCols];
  half k[kStages][kHalves][kBc * kBoxCols];
  half v[kStages][kHalves][kBc * kBoxCols];
  uint64_t q_full;
  uint64_t k_full[kStages];
  uint64_t v_full[kStages];
  uint64_t k_empty[kStages];
  uint64_t v_empty[kStages];
};
static_assert(offsetof(SharedStorage, q) % kAtomBytes == 0 && offsetof(SharedStorage, k) % kAtomBytes == 0 &&
                  offsetof(SharedStorage, v) % kAtomBytes == 0 && (kBc * kBoxRowBytes) % kAtomBytes == 0,
              "every TMA box and wgmma operand starts on a 1024-byte swizzle atom");
constexpr int kQBytes = kBr * kD * sizeof(half);     // 32 KB: the expect-tx count of q_full
constexpr int kTileBytes = kBc * kD * sizeof(half);  // 32 KB: of k_full / v_full
constexpr int kSmemBytes = sizeof(SharedStorage) + kAtomBytes;  // + slack to align the base
static_assert(kSmemBytes <= 232448, "above the 227 KB of shared memory a block may opt in to on sm_90");

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
  const int num_tiles = seq_len / kBc;
  // Rows of the [B*H*S, 128] view the tensor maps describe: this head's first key, this block's Q.
  const int head_row0 = blockIdx.y * seq_len;
  const int q_row0 = head_row0 + blockIdx.x * kBr;

  // ---- barriers, before the roles split ---------------------------------------------------------
  if (thread == 0) {
    tma_prefetch_map(&tmap_q), tma_prefetch_map(&tmap_k), tma_prefetch_map(&tmap_v);
    mbar_init(&smem.q_full, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&smem.k_full[s], 1);
      mbar_init(&smem.v_full[s], 1);
      mbar_init(&smem.k_empty[s], kConsumerWarps);
      mbar_init(&smem.v_empty[s], kConsumerWarps);
    }
    mbar_fence_init();
  }
  __syncthreads();  // the last block-wide barrier: after it, each role goes its own way

  if (wg == 0) {
    // ==== producer warpgroup ======================================================================
    setmaxnreg_dec<kProducerRegs>();
    if (warp == 0 && elect_lane0()) {
      mbar_arrive_expect_tx(&smem.q_full, kQBytes);
      tma_load_tile<kBr>(smem.q[0], &tmap_q, &smem.q_full, q_row0);
      int stage = 0;
      uint32_t phase = 0;  // parity of the current use of `stage`
      for (int tile = 0; tile < num_tiles; ++tile) {
        const int key_row = head_row0 + tile * kBc;
        const bool refill = tile >= kStages;  // the stage held tile - 3: wait until it is handed back
        if (refill) mbar_wait(&smem.k_empty[stage], phase ^ 1);
        mbar_arrive_expect_tx(&smem.k_full[stage], kTileBytes);
        tma_load_tile<kBc>(smem.k[stage][0], &tmap_k, &smem.k_full[stage], key_row);
        if (refill) mbar_wait(&smem.v_empty[stage], phase ^ 1);
        mbar_arrive_expect_tx(&smem.v_full[stage], kTileBytes);
        tma_load_tile<kBc>(smem.v[stage][0], &tmap_v, &smem.v_full[stage], key_row);
        if (++stage == kStages) stage = 0, phase ^= 1;
      }
    }
  } else {
    // ==== consumer warpgroups =====================================================================
    setmaxnreg_inc<kConsumerRegs>();
    const int cwg = wg - 1;  // consumer warpgroup 0 or 1: rows 64 cwg..
    const int g = lane / 4, quad = lane % 4;

    // wgmma descriptors of k-step 0. QK's k-step ks reads head columns 16ks..: box half ks / 4, 32
    // bytes per k-step inside it. PV's k-step kk reads keys 16kk..: 16 rows of 128 bytes further.
    const uint64_t q_desc0 = make_desc_sw128(smem_addr(smem.q[0]) + cwg * kWgRows * kBoxRowBytes, 16, kAtomBytes);
    const auto qk_step = [](int ks, int rows) { return (ks / 4) * rows * kBoxRowBytes + (ks % 4) * 32; };

    float o_acc[64];  // O: 64 rows x 128 head columns per warpgroup
#pragma unroll
    for (int i = 0; i < 64; ++i) o_acc[i] = 0.f;
    float row_max[2] = {-INFINITY, -INFINITY};  // rows g, g + 8: running max of the raw scores
    float row_sum[2] = {0.f, 0.f};              // this thread's part of the running sum of exp

    mbar_wait(&smem.q_full, 0);

    int stage = 0;
    uint32_t phase = 0;
    for (int tile = 0; tile < num_tiles; ++tile) {
      // ---- S = Q K^T: 64 rows x 128 keys per warpgroup, 8 wgmma k16 steps over the head dim ------
      float s_acc[64];
      const uint64_t k_desc0 = make_desc_sw128(smem_addr(smem.k[stage][0]), 16, kAtomBytes);
      mbar_wait(&smem.k_full[stage], phase);
      fence_regs(s_acc);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kD / 16; ++ks)
        wgmma_m64n128k16_ss(s_acc, desc_advance(q_desc0, qk_step(ks, kBr)), desc_advance(k_desc0, qk_step(ks, kBc)),
                            ks > 0);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(s_acc);
      if (lane == 0) mbar_arrive(&smem.k_empty[stage]);  // this warp is done with K(tile)

      // ---- online softmax in registers: a thread holds 32 of the 128 columns of rows g, g + 8 ----
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

      // ---- O += P V: 64 rows x 128 head columns, 8 wgmma k16 steps over the keys -----------------
      // V is [keys][head dims]: B = V with N (head dims) contiguous, MN-major; the two 64-column
      // halves are LBO = 128 keys x 128 B apart, 8-key groups SBO = 1024 B apart.
      const uint64_t v_desc0 = make_desc_sw128(smem_addr(smem.v[stage][0]), kBc * kBoxRowBytes, kAtomBytes);
      mbar_wait(&smem.v_full[stage], phase);
      fence_regs(o_acc);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk)
        wgmma_m64n128k16_rs_bt(o_acc, p_frag[kk], desc_advance(v_desc0, kk * 16 * kBoxRowBytes), 1);
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(o_acc);
      if (lane == 0) mbar_arrive(&smem.v_empty[stage]);  // this warp is done with V(tile)

      if (++stage == kStages) stage = 0, phase ^= 1;
    }

    // ---- O / row_sum -> global, fp16 ------------------------------------------------------------
    half* o_rows = o + size_t(q_row0 + cwg * kWgRows + warp * 16) * kD;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float inv = 1.f / quad_sum(row_sum[h]);
      half* row = o_rows + (g + 8 * h) * kD;
#pragma unroll
      for (int i = 0; i < 16; ++i)
        *reinterpret_cast<uint32_t*>(row + 8 * i + 2 * quad) =
            pack_half2(o_acc[4 * i + 2 * h] * inv, o_acc[4 * i + 2 * h + 1] * inv);
    }
  }
  require_grid_covers(seq_len, kBr, kBc);  // a grid that does not cover S traps: the launch fails loudly
}
