// V16: ping-pong between the two consumer warpgroups (the Hopper line, third step; sm_90a only).
// In V15 each consumer warpgroup multiplies, waits, runs its softmax, multiplies again; the two
// warpgroups are independent, so whenever both happen to be in their softmax the tensor cores
// idle, and when both issue at once their GEMMs interleave and both softmaxes start late. V16
// orders them, as FlashAttention-3's inter-warpgroup overlap ("ping-pong") does: the GEMMs of one
// warpgroup are issued while the other runs its softmax, and the two take turns on the tensor
// cores through a pair of named barriers. The producer, the ring and the softmax are V15's.
//
//   384 threads = 3 warpgroups, __launch_bounds__(384, 1), setmaxnreg 24 / 240 as in V15:
//     warpgroup 0      the producer: one thread issues every TMA (V15's, unchanged)
//     warpgroups 1, 2  consumers A and B (consumer warpgroup c = 0, 1 owns rows 64c..64c+63)
//   Br = 128, Bc = 128, D = 128; grid (S / 128, B*H). Shared memory as V15's: 230504 B, 3 stages.
//
//   A consumer's work is a sequence of GEMM batches, each followed by a softmax:
//     batch 0          QK(0)                      then softmax(0)
//     batch j, 0<j<n   PV(j - 1) and QK(j)        then softmax(j)   (n = S / 128 tiles)
//     batch n          PV(n - 1)                  then the epilogue
//   PV(j - 1) needs P(j - 1) from softmax(j - 1), QK(j) nothing but K(j): the two are issued
//   together, one commit group, waited for together. softmax(j) rescales O after PV(j - 1) has
//   landed in it and before PV(j) adds to it: the order of operations on O is V15's.
//
//   Schedule: the batches of A and B alternate on the tensor cores, A first:
//
//   tensor cores | A: QK0 | B: QK0 | A: PV0 QK1 | B: PV0 QK1 | A: PV1 QK2 | B: PV1 QK2 | ...
//   consumer A   | issue  |   softmax 0         | issue      |  softmax 1              | issue
//   consumer B   |  turn  | issue  |  softmax 0              | issue      |  softmax 1
//
//   Each turn is taken and passed on named barriers of 256 threads (both consumers): consumer c
//   takes its turn with bar.sync turn[c] (its 128 threads plus the 128 of the other consumer's
//   bar.arrive complete it) and passes it with bar.arrive turn[1 - c] right after its commit, not
//   after its wait: the other's GEMMs queue behind its own on the tensor cores while it waits for
//   its own results and runs its softmax.
//     A's batch k (k >= 1) waits for B's turn-passing after B's batch k - 1;
//     B's batch k waits for A's turn-passing after A's batch k.
//   So A skips the sync of its batch 0 and B the arrive of its batch n: turn[0] sees n syncs of A
//   and n arrives of B, turn[1] n + 1 of each, and every barrier is left as it started. A cannot
//   arrive twice on turn[1] before B has synced on it once: between the two, A syncs on turn[0],
//   which needs B's arrive after that sync.
//   Data waits (k_full, v_full) come before the turn: a consumer never holds the tensor cores while
//   its tiles are still landing.
//
//   Stage hand-back: after batch j's wait, the warp arrives on v_empty of tile j - 1's stage and
//   k_empty of tile j's (one arrival per consumer warp, 8 per barrier, as in V15).
//
//   Per consumer thread: O 64 fp32, and during a batch both S(j) 64 fp32 (being written by QK(j))
//   and P(j - 1) 32 x f16x2 (being read by PV(j - 1)): 160 live accumulator and operand registers
//   across the batch (in V15 S died into P before PV), under the 240 of setmaxnreg.
//
// Choice: the turn barriers are ids 1 and 2 (0 is __syncthreads'), one per consumer, rather than
// one shared barrier: with one, a warpgroup could pass its own turn to itself. The id is a register
// (1 + consumer), so ptxas reports all 16 barriers used; with one block per SM that costs nothing.
// Choice: batch 0 and batch n are peeled out of the tile loop rather than guarded inside it: the
// loop body issues exactly 16 wgmma with no condition, and the schedule reads as drawn above.
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
    // s_acc[4i + 2h + e]: row g + 8h, key 8i + 2*quad + e), O rescaled, P packed as wgmma A
    // fragments: k16 slice kk (keys 16kk..) is accumulator blocks 2kk, 2kk + 1.
    const auto softmax = [&] {
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

    // ---- batches 1 .. n - 1: PV(j - 1) and QK(j) ------------------------------------------------
    int pv_stage = 0;  // stage of tile j - 1
    uint32_t pv_phase = 0;
    int stage = 1 % kStages;  // stage of tile j
    uint32_t phase = 0;
    for (int tile = 1; tile < num_tiles; ++tile) {
      mbar_wait(&smem.v_full[pv_stage], pv_phase);
      mbar_wait(&smem.k_full[stage], phase);
      named_bar_sync(my_turn, kConsumerThreads);
      batch_begin();
      issue_pv(pv_stage);
      issue_qk(stage);
      wgmma_commit();
      named_bar_arrive(their_turn, kConsumerThreads);
      wgmma_wait<0>();
      fence_regs(o_acc), fence_regs(s_acc);
      if (lane == 0) mbar_arrive(&smem.v_empty[pv_stage]), mbar_arrive(&smem.k_empty[stage]);
      softmax();
      pv_stage = stage, pv_phase = phase;
      if (++stage == kStages) stage = 0, phase ^= 1;
    }

    // ---- batch n: PV(n - 1) -----------------------------------------------------------------------
    mbar_wait(&smem.v_full[pv_stage], pv_phase);
    named_bar_sync(my_turn, kConsumerThreads);
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
