// V17: intra-warpgroup overlap of the softmax with PV (the Hopper line, fourth step; sm_90a only).
// V16's ping-pong overlaps one consumer's softmax with the other's GEMMs, but each consumer still
// waits for the whole of its batch (PV(j - 1) and QK(j)) before its softmax(j): the softmax needs
// only S(j), yet starts after PV(j - 1) too. V17 splits the batch into two commit groups, QK(j)
// first, and waits for that one alone (wgmma.wait_group 1) before softmax(j), so softmax(j) runs
// while PV(j - 1) is still on the tensor cores: FlashAttention-3's two-stage pipelining inside a
// warpgroup, on top of its ping-pong between warpgroups. The producer and the ring are V15's, the
// turns V16's.
//
//   384 threads = 3 warpgroups, __launch_bounds__(384, 1), setmaxnreg 24 / 240 as in V15:
//     warpgroup 0      the producer: one thread issues every TMA (V15's, unchanged)
//     warpgroups 1, 2  consumers A and B (consumer warpgroup c = 0, 1 owns rows 64c..64c+63)
//   Br = 128, Bc = 128, D = 128; grid (S / 128, B*H). Shared memory as V15's: 230504 B, 3 stages.
//
//   A consumer's batches, as in V16, now each of two commit groups (n = S / 128 tiles):
//     batch 0         QK(0); wait 0; hand back K(0); softmax(0)
//     batch j, 0<j<n  wait 0 (PV(j - 2) done); hand back V(j - 2); pack P(j - 1)
//                     | take turn | QK(j), commit; O *= rescale(j - 1); PV(j - 1), commit | pass turn
//                     wait 1 (QK(j) done); hand back K(j); softmax(j)   <- overlaps PV(j - 1)
//     batch n         wait 0; hand back V(n - 2); pack P(n - 1)
//                     | take turn | O *= rescale(n - 1); PV(n - 1), commit | pass turn (A only)
//                     wait 0; hand back V(n - 1); the epilogue
//
//   Schedule of one consumer (its turns with the other consumer are V16's):
//
//   tensor cores | QK(j)  PV(j - 1)       |  (the other's QK(j), PV(j - 1))  | QK(j + 1) ...
//   consumer     | issue both; wait 1 | softmax(j) ........ | wait 0; pack P(j) | issue ...
//
//   Turns (V16's): consumer c takes its turn with bar.sync turn[c] and passes it with bar.arrive
//   turn[1 - c] right after its commits (named barriers 1 + c, 256 threads); A skips the sync of
//   its batch 0, B the arrive of its batch n, so both barriers are left as they started.
//
//   What moved, and why:
//   - softmax(j) must not touch O or P(j - 1): PV(j - 1) writes the one and reads the other while
//     it runs. So the softmax only computes exp(S - max) in place in S(j), the row sums and the
//     factors rescale[] by which O is to shrink; O is multiplied by them at the next batch,
//     between the issue of QK(j + 1), which does not touch O, and that of PV(j) (a second
//     wgmma.fence before PV: O was just written by ordinary instructions), and S(j) is packed into
//     P(j) after the wait for PV(j - 1), whose operand registers P(j) reuses. The order of the
//     operations on O is V16's: ... O * rescale(j - 1) + P(j - 1) V(j - 1), * rescale(j), + P(j) V(j).
//   - wgmma groups complete in the order they were committed: wait_group 1 after the two commits
//     means QK(j)'s group is done, and K(j) is handed back there; V(j - 1) after wait_group 0.
//   - the loop is rotated: the wait for PV(j - 1) opens iteration j + 1 (after its mbarrier waits)
//     instead of closing iteration j. At the end of iteration j, ptxas moves the wait_group 0 up
//     into the softmax (nothing in the softmax depends on it, nor it on the softmax, and it
//     schedules the wait early): the SASS then has every exp after the wait and no overlap at all.
//     Behind the spin loops of the mbarrier waits it stays where it is written.
//
//   Per consumer thread: O 64 fp32 and P(j - 1) 32 x f16x2 in flight during softmax(j), S(j) 64
//   fp32 being exponentiated in place: 160 registers, as in V16, under the 240 of setmaxnreg.
//
// Choice: only the waits inside the warpgroup change; the turn is still passed right after the
// issue, so the tensor-core order of V16 (A's batch, B's batch, ...) is kept.
// Choice: the packing of P(j) stays out of the overlap (32 conversions after wait_group 0): doing
// it during the softmax would need a second P buffer (32 registers more).
//
#include "hopper.cuh"

using namespace flash;
using namespace flash::hopper;

namespace {

constexpr int kThreads = 384;
constexpr int kConsumerWarpgroups = 2;
constexpr int kConsumerThreads = kConsumerWarpgroups * 128;  // the arrival count of a turn barrier
constexpr int kConsumerWarps = kConsumerWarpgroups * 4;      // the arrival count of an empty barrier
constexpr int kTurnBar = 1;                                  // turn[c] is named barrier 1 + c
constexpr int kProducerRegs = 24;                            // setmaxnreg.dec of warpgroup 0
constexpr int kConsumerRegs = 240;                           // setmaxnreg.inc of warpgroups 1, 2
static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= 65536, "the register file");
constexpr int kBr = 128;                                     // query rows per block
constexpr int kWgRows = kBr / kConsumerWarpgroups;           // 64 rows per consumer warpgroup: one wgmma M
constexpr int kBc = 128;                                     // keys per K/V tile: one wgmma N (QK)
constexpr int kD = kHeadDim;                                 // 128: PV's wgmma N
constexpr int kStages = 3;                                   // K/V ring depth
constexpr int kHalves = kD / kBoxCols;                       // 2 boxes of 64 head columns per row
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
    // ==== producer warpgroup (V15's) ==============================================================
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
    const int cwg = wg - 1;  // consumer warpgroup 0 (A) or 1 (B): rows 64 cwg..
    const int g = lane / 4, quad = lane % 4;
    const int my_turn = kTurnBar + cwg, their_turn = kTurnBar + (1 - cwg);

    // wgmma descriptors of k-step 0. QK's k-step ks reads head columns 16ks..: box half ks / 4, 32
    // bytes per k-step inside it. PV's k-step kk reads keys 16kk..: 16 rows of 128 bytes further.
    const uint64_t q_desc0 = make_desc_sw128(smem_addr(smem.q[0]) + cwg * kWgRows * kBoxRowBytes, 16, kAtomBytes);
    const auto qk_step = [](int ks, int rows) { return (ks / 4) * rows * kBoxRowBytes + (ks % 4) * 32; };

    float o_acc[64];  // O: 64 rows x 128 head columns per warpgroup
#pragma unroll
    for (int i = 0; i < 64; ++i) o_acc[i] = 0.f;
    float s_acc[64];               // S of the tile whose QK is in the current batch
    uint32_t p_frag[kBc / 16][4];  // P of the tile whose PV is in the current batch
    float row_max[2] = {-INFINITY, -INFINITY};  // rows g, g + 8: running max of the raw scores
    float row_sum[2] = {0.f, 0.f};              // this thread's part of the running sum of exp

    // ---- the pieces of a batch -------------------------------------------------------------------
    // S = Q K^T: 64 rows x 128 keys per warpgroup, 8 wgmma k16 steps over the head dim.
    const auto issue_qk = [&](int stage) {
      const uint64_t k_desc0 = make_desc_sw128(smem_addr(smem.k[stage][0]), 16, kAtomBytes);
#pragma unroll
      for (int ks = 0; ks < kD / 16; ++ks)
        wgmma_m64n128k16_ss(s_acc, desc_advance(q_desc0, qk_step(ks, kBr)), desc_advance(k_desc0, qk_step(ks, kBc)),
                            ks > 0);
    };
    // O += P V: 64 rows x 128 head columns, 8 wgmma k16 steps over the keys. V is [keys][head dims]:
    // B = V with N (head dims) contiguous, MN-major; the two 64-column halves are LBO = 128 keys x
    // 128 B apart, 8-key groups SBO = 1024 B apart.
    const auto issue_pv = [&](int stage) {
      const uint64_t v_desc0 = make_desc_sw128(smem_addr(smem.v[stage][0]), kBc * kBoxRowBytes, kAtomBytes);
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk)
        wgmma_m64n128k16_rs_bt(o_acc, p_frag[kk], desc_advance(v_desc0, kk * 16 * kBoxRowBytes), 1);
    };
    // Before a batch: the registers its wgmma write or read were last touched by ordinary code.
    const auto batch_begin = [&] {
      fence_regs(o_acc), fence_regs(s_acc);
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk) fence_regs(p_frag[kk]);
      wgmma_fence();
    };
    // Online softmax of S in registers (a thread holds 32 of the 128 columns of rows g, g + 8;
    // s_acc[4i + 2h + e]: row g + 8h, key 8i + 2*quad + e). It leaves exp(S - max) in s_acc and
    // the factors O is to be rescaled by in rescale[]: O itself may still be in flight.
    float rescale[2];
    const auto softmax = [&] {
      float neg_max_scaled[2];
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
      }
    };
    // O rescaled by the factors of the last softmax (its columns are head dims, its rows the same
    // g, g + 8): between the issue of QK(j), which does not touch O, and that of PV(j - 1).
    const auto rescale_o = [&] {
#pragma unroll
      for (int i = 0; i < 64; ++i) o_acc[i] *= rescale[(i / 2) % 2];
    };
    // Once PV(j - 1) is done with P(j - 1): P(j) packed as wgmma A fragments, k16 slice kk (keys
    // 16kk..) from accumulator blocks 2kk, 2kk + 1.
    const auto pack_p = [&] {
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) p_frag[kk][r] = pack_half2(s_acc[8 * kk + 2 * r], s_acc[8 * kk + 2 * r + 1]);
    };

    mbar_wait(&smem.q_full, 0);

    // ---- batch 0: QK(0) ---------------------------------------------------------------------------
    mbar_wait(&smem.k_full[0], 0);
    if (cwg != 0) named_bar_sync(my_turn, kConsumerThreads);  // A goes first
    batch_begin();
    issue_qk(0);
    wgmma_commit();
    named_bar_arrive(their_turn, kConsumerThreads);
    wgmma_wait<0>();
    fence_regs(s_acc);
    if (lane == 0) mbar_arrive(&smem.k_empty[0]);
    softmax();

    // ---- batches 1 .. n - 1: QK(j), then PV(j - 1), two commit groups --------------------------
    // The loop is rotated: the wait for PV(j - 2), the hand-back of V(j - 2) and the packing of
    // P(j - 1) open iteration j, after its waits for data, rather than close iteration j - 1. ptxas
    // schedules a wgmma.wait_group as early as its block allows (nothing in the softmax depends on
    // it, nor it on the softmax): at the end of iteration j - 1 it would move above the softmax and
    // undo the overlap; behind the spin loops of the mbarrier waits it stays (as the SASS shows).
    int pv_stage = 0;  // stage of tile j - 1
    uint32_t pv_phase = 0;
    int stage = 1 % kStages;  // stage of tile j
    uint32_t phase = 0;
    for (int tile = 1; tile < num_tiles; ++tile) {
      mbar_wait(&smem.k_full[stage], phase);
      mbar_wait(&smem.v_full[pv_stage], pv_phase);
      wgmma_wait<0>();  // PV(j - 2) complete (nothing pending at j = 1)
      fence_regs(o_acc);
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk) fence_regs(p_frag[kk]);
      if (tile > 1 && lane == 0) mbar_arrive(&smem.v_empty[pv_stage == 0 ? kStages - 1 : pv_stage - 1]);
      pack_p();  // P(j - 1)
      named_bar_sync(my_turn, kConsumerThreads);
      batch_begin();
      issue_qk(stage);
      wgmma_commit();
      rescale_o();  // by softmax(j - 1)'s factors, while QK(j) runs
      fence_regs(o_acc);
      wgmma_fence();  // O was just written by ordinary instructions
      issue_pv(pv_stage);
      wgmma_commit();
      named_bar_arrive(their_turn, kConsumerThreads);
      wgmma_wait<1>();  // QK(j) complete; PV(j - 1) may still run
      fence_regs(s_acc);
      if (lane == 0) mbar_arrive(&smem.k_empty[stage]);
      softmax();  // overlaps PV(j - 1)
      pv_stage = stage, pv_phase = phase;
      if (++stage == kStages) stage = 0, phase ^= 1;
    }

    // ---- batch n: PV(n - 1) -----------------------------------------------------------------------
    mbar_wait(&smem.v_full[pv_stage], pv_phase);
    wgmma_wait<0>();  // PV(n - 2) complete (nothing pending if n = 1)
    fence_regs(o_acc);
#pragma unroll
    for (int kk = 0; kk < kBc / 16; ++kk) fence_regs(p_frag[kk]);
    if (num_tiles > 1 && lane == 0) mbar_arrive(&smem.v_empty[pv_stage == 0 ? kStages - 1 : pv_stage - 1]);
    pack_p();  // P(n - 1)
    named_bar_sync(my_turn, kConsumerThreads);
    rescale_o();
    batch_begin();
    issue_pv(pv_stage);
    wgmma_commit();
    if (cwg != 1) named_bar_arrive(their_turn, kConsumerThreads);  // B's last turn is passed to no one
    wgmma_wait<0>();
    fence_regs(o_acc);
    if (lane == 0) mbar_arrive(&smem.v_empty[pv_stage]);

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
