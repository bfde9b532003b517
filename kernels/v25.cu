// V25: a block's first Q loaded before its first K (the Hopper line, twelfth step; sm_90a only).
// In V21's order the producer issues a work tile's first K, then its Q. At a block's start all 132
// blocks issue their first loads at once, about 8.65 MB, and the first QK waits 3.5k of the block's
// 4.2-4.7k starting cycles for Q (NOTES: V23's stamped timeline). The blocks of one head share its
// first K, which after the first of them is mostly read from L2; each block's Q is its own, from DRAM.
// V25 issues the block's first Q before its first K; every later work tile keeps V21's order.
// Choice: the block's first work tile only. At every later one the load of Q waits for the consumers
//   to hand the previous Q back, and V21 issues K first so that no load waits behind a buffer
//   released later than its own.
// Measured on the H200, level (not kept; NOTES): cycles against V24 in the same call +0.2%, +0.1%,
//   -0.7%, 0.0%, +0.2% at S = 1024 .. 16384; head-to-head, 6 rounds, V24's time over V25's, by graph
//   1.009 [1.000, 1.021] at the case and 1.001 [0.987, 1.022] at 4096, back to back 0.999 [0.993,
//   1.006] and 0.998 [0.984, 1.002]: level, all four.
//
//   A block's first loads (the producer's TMA issue):
//
//     V24  producer  K(0) Q_A Q_B | K(1) V(0) | ..
//     V25  producer  Q_A Q_B K(0) | K(1) V(0) | ..
//
//   384 threads = 3 warpgroups, __launch_bounds__(384, 1), setmaxnreg 24 / 240, once per block:
//     warpgroup 0      the producer: one thread issues every TMA, in V21's order (Q by warpgroup rows)
//     warpgroups 1, 2  consumers A and B (consumer warpgroup c = 0, 1 owns rows 64c..64c+63)
//   Br = 128, Bc = 128, D = 128. Shared memory: Q 32 KB, 2 K/V stages (128 KB), O 32 KB, the barriers.
//   Everything else is V24's.
//
#include "hopper.cuh"

using namespace flash;
using namespace flash::hopper;

namespace {

constexpr int kThreads = 384;
constexpr int kCtasPerSm = 1;                                // the persistent grid: one block per SM
constexpr int kConsumerWarpgroups = 2;
constexpr int kConsumerThreads = kConsumerWarpgroups * 128;  // the arrival count of a turn barrier
constexpr int kConsumerWarps = kConsumerWarpgroups * 4;      // the arrival count of an empty barrier
constexpr int kTurnBar = 1;                                  // turn[c] is named barrier 1 + c
constexpr int kOBar = 3;                                     // o_bar[c] is named barrier 3 + c (128 threads)
constexpr int kProducerRegs = 24;                            // setmaxnreg.dec of warpgroup 0
constexpr int kConsumerRegs = 240;                           // setmaxnreg.inc of warpgroups 1, 2
static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= 65536, "the register file");
constexpr int kBr = 128;                                     // query rows per work tile
constexpr int kWgRows = kBr / kConsumerWarpgroups;           // 64 rows per consumer warpgroup: one wgmma M
constexpr int kBc = 128;                                     // keys per K/V tile: one wgmma N (QK)
constexpr int kD = kHeadDim;                                 // 128: PV's wgmma N
constexpr float kRescaleLog2 = 8.f;                          // V22: m moves when (max - m) * scale_log2 > 8
constexpr float kRescaleP = 256.f;                           // V23: the same, seen on P: P > 2^8
constexpr int kStages = 2;                                   // K/V ring depth (V18: 3; room for O)
constexpr int kHalves = kD / kBoxCols;                       // 2 boxes of 64 head columns per row
static_assert(kWgRows == 64 && kBc == 128 && kD == 128, "the wgmma shapes below are m64n128k16");

struct SharedStorage {
  half q[kHalves][kBr * kBoxCols];
  half k[kStages][kHalves][kBc * kBoxCols];
  half v[kStages][kHalves][kBc * kBoxCols];
  half o[kHalves][kBr * kBoxCols];  // V19: the O tile the TMA stores read, the o map's layout
  uint64_t q_full[kConsumerWarpgroups];   // V24: consumer warpgroup c's 64 rows of Q have landed
  uint64_t q_empty[kConsumerWarpgroups];  // V24: warpgroup c is done with its rows; the next may be loaded
  uint64_t k_full[kStages];
  uint64_t v_full[kStages];
  uint64_t k_empty[kStages];
  uint64_t v_empty[kStages];
};
static_assert(offsetof(SharedStorage, q) % kAtomBytes == 0 && offsetof(SharedStorage, k) % kAtomBytes == 0 &&
                  offsetof(SharedStorage, v) % kAtomBytes == 0 && offsetof(SharedStorage, o) % kAtomBytes == 0 &&
                  (kBc * kBoxRowBytes) % kAtomBytes == 0 && (kWgRows * kBoxRowBytes) % kAtomBytes == 0,
              "every TMA box and wgmma operand starts on a 1024-byte swizzle atom");
constexpr int kQRowsBytes = kWgRows * kD * sizeof(half);  // 16 KB: the expect-tx count of q_full[c]
constexpr int kTileBytes = kBc * kD * sizeof(half);  // 32 KB: of k_full / v_full
constexpr int kSmemBytes = sizeof(SharedStorage) + kAtomBytes;  // + slack to align the base
static_assert(kSmemBytes <= 232448, "above the 227 KB of shared memory a block may opt in to on sm_90");

}  // namespace

FLASH_LAUNCH_CONTRACT_TMA_PERSISTENT_O(kThreads, kBr, kBc, kSmemBytes, kWgRows, kBc, kWgRows, kCtasPerSm)

extern "C" __global__ void __launch_bounds__(kThreads, kCtasPerSm)
flash_attention_forward(const half* __restrict__ q, const half* __restrict__ k, const half* __restrict__ v,
                        half* __restrict__ o, int seq_len, float scale_log2, const __grid_constant__ CUtensorMap tmap_q,
                        const __grid_constant__ CUtensorMap tmap_k, const __grid_constant__ CUtensorMap tmap_v,
                        const __grid_constant__ CUtensorMap tmap_o, int row_tiles, int heads) {
  // The logical grid must cover S with whole row and key tiles; checked first, before anyone waits
  // for a tile (with S < Bc a consumer would wait for a K tile no one loads).
  require_tiles_cover(seq_len, row_tiles, heads, kBr, kBc);

  extern __shared__ unsigned char smem_raw[];
  SharedStorage& smem =
      *reinterpret_cast<SharedStorage*>(smem_raw + (kAtomBytes - smem_addr(smem_raw) % kAtomBytes) % kAtomBytes);

  const int thread = threadIdx.x, wg = thread / 128, warp = (thread / 32) % 4, lane = thread % 32;
  const int num_tiles = seq_len / kBc;          // K/V tiles per work tile
  const int work_tiles = row_tiles * heads;     // what the blocks share
  const int first_work = blockIdx.x, work_step = gridDim.x;
  // Rows of the [B*H*S, 128] view the tensor maps describe: work tile w's head's first key, its Q.
  const auto head_row0 = [&](int w) { return (w / row_tiles) * seq_len; };
  const auto q_row0 = [&](int w) { return head_row0(w) + (w % row_tiles) * kBr; };

  // ---- barriers, before the roles split ---------------------------------------------------------
  if (thread == 0) {
    tma_prefetch_map(&tmap_q), tma_prefetch_map(&tmap_k), tma_prefetch_map(&tmap_v), tma_prefetch_map(&tmap_o);
    for (int c = 0; c < kConsumerWarpgroups; ++c) {
      mbar_init(&smem.q_full[c], 1);
      mbar_init(&smem.q_empty[c], kConsumerWarps / kConsumerWarpgroups);
    }
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
    // ==== producer warpgroup: the loads in V21's order, for every work tile of the block ===============
    setmaxnreg_dec<kProducerRegs>();
    if (warp == 0 && elect_lane0()) {
      // The i-th K (V) tile the block loads, over all its work tiles, goes to stage i % kStages, the
      // use u = i / kStages of it; from the second use on, the load waits for the stage's release,
      // the empty barrier's completion u - 1 (parity (u - 1) & 1). The consumers count the same i.
      const auto load_k = [&](int i, int key_row) {
        const int stage = i % kStages, use = i / kStages;
        if (use > 0) mbar_wait(&smem.k_empty[stage], (use - 1) & 1);
        mbar_arrive_expect_tx(&smem.k_full[stage], kTileBytes);
        tma_load_tile<kBc>(smem.k[stage][0], &tmap_k, &smem.k_full[stage], key_row);
      };
      const auto load_v = [&](int i, int key_row) {
        const int stage = i % kStages, use = i / kStages;
        if (use > 0) mbar_wait(&smem.v_empty[stage], (use - 1) & 1);
        mbar_arrive_expect_tx(&smem.v_full[stage], kTileBytes);
        tma_load_tile<kBc>(smem.v[stage][0], &tmap_v, &smem.v_full[stage], key_row);
      };
      uint32_t q_phase = 0;  // parity of the block's current work tile k (k & 1)
      // V24: warpgroup c's rows (both 64-column boxes of them) once c is done with its rows of Q(k - 1)
      const auto load_q = [&](int w) {
        for (int c = 0; c < kConsumerWarpgroups; ++c) {
          if (w != first_work) mbar_wait(&smem.q_empty[c], q_phase ^ 1);
          mbar_arrive_expect_tx(&smem.q_full[c], kQRowsBytes);
          tma_load_2d(smem.q[0] + c * kWgRows * kBoxCols, &tmap_q, &smem.q_full[c], 0, q_row0(w) + c * kWgRows);
          tma_load_2d(smem.q[1] + c * kWgRows * kBoxCols, &tmap_q, &smem.q_full[c], kBoxCols, q_row0(w) + c * kWgRows);
        }
        q_phase ^= 1;
      };
      // V21: K(i), then V(i - 1), then, at a work tile's first key tile, its Q (V24: A's rows, then B's).
      int i = 0, previous_key_row = 0;
      for (int w = first_work; w < work_tiles; w += work_step)
        for (int tile = 0; tile < num_tiles; ++tile, ++i) {
          const int key_row = head_row0(w) + tile * kBc;
          if (i == 0) load_q(w);  // V25: the block's first Q before its first K
          load_k(i, key_row);
          if (i > 0) load_v(i - 1, previous_key_row);
          if (tile == 0 && i > 0) load_q(w);
          previous_key_row = key_row;
        }
      if (i > 0) load_v(i - 1, previous_key_row);
    }
  } else {
    // ==== consumer warpgroups =====================================================================
    setmaxnreg_inc<kConsumerRegs>();
    // Consumer warpgroup 0 (A) or 1 (B): rows 64 cwg.. V20: read through a shuffle from lane 0, so
    // that the compiler knows every lane holds the same value and keeps it, and the Q descriptor made
    // from it, in uniform registers (no moves into them while the warpgroup holds the turn).
    const int cwg = __shfl_sync(0xffffffff, wg - 1, 0);
    const int my_turn = kTurnBar + cwg, their_turn = kTurnBar + (1 - cwg);
    const bool store_thread = warp == 0 && lane == 0;  // issues (and waits for) this warpgroup's O stores

    // wgmma descriptors of k-step 0. QK's k-step ks reads head columns 16ks..: box half ks / 4, 32
    // bytes per k-step inside it. PV's k-step kk reads keys 16kk..: 16 rows of 128 bytes further.
    const uint64_t q_desc0 = make_desc_sw128(smem_addr(smem.q[0]) + cwg * kWgRows * kBoxRowBytes, 16, kAtomBytes);
    const auto qk_step = [](int ks, int rows) { return (ks / 4) * rows * kBoxRowBytes + (ks % 4) * 32; };

    float o_acc[64];  // O: 64 rows x 128 head columns per warpgroup (zeroed at each work tile)
    float s_acc[64];               // S of the tile whose QK is in the current batch
    uint32_t p_frag[kBc / 16][4];  // P of the tile whose PV is in the current batch
    float row_max[2];  // rows g, g + 8: m, (max - m) * scale_log2 <= 8 (V22; -inf at each work tile)
    float row_sum[2];  // this thread's part of the running sum of exp (0 at each work tile)

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
    // s_acc[4i + 2h + e]: row g + 8h, key 8i + 2*quad + e). It leaves exp(S - m) in s_acc and
    // the factors O is to be rescaled by in rescale[]: O itself may still be in flight. V22: row_max
    // holds m, which moves to the running max only when (max - m) * scale_log2 > kRescaleLog2
    // (always at a work tile's first tile, where m = -inf); rescale_o_needed: whether any row of
    // this warp moved its m, the same in every lane.
    float rescale[2];
    bool rescale_o_needed = true;
    const auto softmax = [&] {
      float neg_max_scaled[2];
      bool moved = false;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int i = 0; i < 16; ++i) tile_max = fmaxf(tile_max, fmaxf(s_acc[4 * i + 2 * h], s_acc[4 * i + 2 * h + 1]));
        const float new_max = fmaxf(row_max[h], quad_max(tile_max));
        rescale[h] = 1.f;
        if ((new_max - row_max[h]) * scale_log2 > kRescaleLog2) {
          rescale[h] = fast_exp2((row_max[h] - new_max) * scale_log2);
          row_max[h] = new_max;
          moved = true;
        }
        neg_max_scaled[h] = -row_max[h] * scale_log2;
        row_sum[h] *= rescale[h];
      }
      rescale_o_needed = __any_sync(0xffffffff, moved);
#pragma unroll
      for (int i = 0; i < 64; ++i) {
        const int h = (i / 2) % 2;
        s_acc[i] = fast_exp2(fmaf(s_acc[i], scale_log2, neg_max_scaled[h]));
        row_sum[h] += s_acc[i];
      }
    };
    // V23: P against the current m first; the max only where a thread's part of a row sums above
    // 2^8 (true whenever one of its P is). Leaves what softmax leaves, or returns false with m and the
    // sums untouched: a P or a sum of the warp overflowed, and S must be multiplied again (recompute_s).
    const auto softmax_against_m = [&] {
      float neg_max_scaled[2], tile_sum[2] = {0.f, 0.f};
#pragma unroll
      for (int h = 0; h < 2; ++h) neg_max_scaled[h] = -row_max[h] * scale_log2;
#pragma unroll
      for (int i = 0; i < 64; ++i) {
        const int h = (i / 2) % 2;
        s_acc[i] = fast_exp2(fmaf(s_acc[i], scale_log2, neg_max_scaled[h]));
        tile_sum[h] += s_acc[i];
      }
      rescale[0] = rescale[1] = 1.f;
      rescale_o_needed = false;
      if (__any_sync(0xffffffff, tile_sum[0] > kRescaleP || tile_sum[1] > kRescaleP)) {
        float p_max[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float m = 0.f;
#pragma unroll
          for (int i = 0; i < 16; ++i) m = fmaxf(m, fmaxf(s_acc[4 * i + 2 * h], s_acc[4 * i + 2 * h + 1]));
          p_max[h] = quad_max(m);
        }
        // An overflowed P, or a sum of finite ones: S is needed again. (Below, 1 / p_max is subnormal
        // for p_max above 2^126: exact, as nvcc_flags flush no denormals.)
        const bool overflow = p_max[0] == INFINITY || p_max[1] == INFINITY || tile_sum[0] == INFINITY ||
                              tile_sum[1] == INFINITY;
        if (__any_sync(0xffffffff, overflow)) return false;
        bool moved = false;
#pragma unroll
        for (int h = 0; h < 2; ++h)
          if (p_max[h] > kRescaleP) {  // V22's rule: m moves to the tile's max, P and the sums with it
            rescale[h] = 1.f / p_max[h];
            row_max[h] += __log2f(p_max[h]) / scale_log2;
            tile_sum[h] *= rescale[h];
            moved = true;
          }
        rescale_o_needed = __any_sync(0xffffffff, moved);
        if (rescale_o_needed) {
#pragma unroll
          for (int i = 0; i < 64; ++i) s_acc[i] *= rescale[(i / 2) % 2];
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) row_sum[h] = row_sum[h] * rescale[h] + tile_sum[h];
      return true;
    };
    // This thread's 64 elements of S = Q K^T for K/V stage `stage`, on the FMA pipe from the swizzled
    // tiles (hopper.cuh's layout): the rare path of softmax_against_m, taken by a whole warp.
    const auto recompute_s = [&](int stage) {
      const int g = lane / 4, quad = lane % 4;
#pragma unroll
      for (int i = 0; i < 64; ++i) {
        const int q_row = cwg * kWgRows + warp * 16 + g + 8 * ((i / 2) % 2), key = 8 * (i / 4) + 2 * quad + i % 2;
        float dot = 0.f;
#pragma unroll 1
        for (int c = 0; c < kD; c += 2) {
          const float2 a = __half22float2(*reinterpret_cast<const __half2*>(tile_element<kBr>(smem.q[0], q_row, c)));
          const float2 b = __half22float2(*reinterpret_cast<const __half2*>(tile_element<kBc>(smem.k[stage][0], key, c)));
          dot = fmaf(a.x, b.x, fmaf(a.y, b.y, dot));
        }
        s_acc[i] = dot;
      }
    };
    // O rescaled by the factors of the last softmax (its columns are head dims, its rows the same
    // g, g + 8): once PV(j - 2) is complete, before the turn (V20).
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

    // Done with this warpgroup's rows of this work tile's Q (after its last QK and the softmax that may
    // read them again): the producer may load the next work tile's rows of this warpgroup (V24).
    const auto release_q = [&] {
      if (lane == 0) mbar_arrive(&smem.q_empty[cwg]);
    };

    int stage = 0;  // stage and phase of the next K/V tile to multiply, running over the work tiles
    uint32_t phase = 0;
    uint32_t q_phase = 0;  // parity of the block's current work tile
    for (int w = first_work; w < work_tiles; w += work_step) {
      const bool first_work_tile = w == first_work, last_work_tile = w + work_step >= work_tiles;
#pragma unroll
      for (int i = 0; i < 64; ++i) o_acc[i] = 0.f;
      row_max[0] = row_max[1] = -INFINITY;
      row_sum[0] = row_sum[1] = 0.f;

      mbar_wait(&smem.q_full[cwg], q_phase);
      q_phase ^= 1;

      // ---- batch 0: QK(0) -------------------------------------------------------------------------
      mbar_wait(&smem.k_full[stage], phase);
      if (cwg != 0 || !first_work_tile) named_bar_sync(my_turn, kConsumerThreads);  // A goes first, once
      batch_begin();
      issue_qk(stage);
      wgmma_commit();
      named_bar_arrive(their_turn, kConsumerThreads);
      wgmma_wait<0>();
      fence_regs(s_acc);
      if (lane == 0) mbar_arrive(&smem.k_empty[stage]);
      if (num_tiles == 1) release_q();
      softmax();

      // ---- batches 1 .. n - 1: QK(j), then PV(j - 1), two commit groups (V17's rotated loop) ------
      int pv_stage = stage;  // stage of tile j - 1
      uint32_t pv_phase = phase;
      if (++stage == kStages) stage = 0, phase ^= 1;
      for (int tile = 1; tile < num_tiles; ++tile) {
        mbar_wait(&smem.k_full[stage], phase);
        mbar_wait(&smem.v_full[pv_stage], pv_phase);
        wgmma_wait<0>();  // PV(j - 2) complete (nothing pending at j = 1)
        fence_regs(o_acc);
#pragma unroll
        for (int kk = 0; kk < kBc / 16; ++kk) fence_regs(p_frag[kk]);
        if (tile > 1 && lane == 0) mbar_arrive(&smem.v_empty[pv_stage == 0 ? kStages - 1 : pv_stage - 1]);
        pack_p();     // P(j - 1)
        if (rescale_o_needed) rescale_o();  // by softmax(j - 1)'s factors, before the turn (V20); V22: if m moved
        named_bar_sync(my_turn, kConsumerThreads);
        batch_begin();  // one fence for both products: P and O were written by ordinary instructions
        issue_qk(stage);
        wgmma_commit();
        issue_pv(pv_stage);
        wgmma_commit();
        named_bar_arrive(their_turn, kConsumerThreads);
        wgmma_wait<1>();  // QK(j) complete; PV(j - 1) may still run
        fence_regs(s_acc);
        if (!softmax_against_m()) {  // overlaps PV(j - 1); V23: rarely, S again and V22's softmax of it
          recompute_s(stage);
          softmax();
        }
        if (lane == 0) mbar_arrive(&smem.k_empty[stage]);  // V23: K (and Q) read again at most above
        if (tile == num_tiles - 1) release_q();  // the last QK of this work tile has read Q
        pv_stage = stage, pv_phase = phase;
        if (++stage == kStages) stage = 0, phase ^= 1;
      }

      // ---- batch n: PV(n - 1) ---------------------------------------------------------------------
      mbar_wait(&smem.v_full[pv_stage], pv_phase);
      wgmma_wait<0>();  // PV(n - 2) complete (nothing pending if n = 1)
      fence_regs(o_acc);
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk) fence_regs(p_frag[kk]);
      if (num_tiles > 1 && lane == 0) mbar_arrive(&smem.v_empty[pv_stage == 0 ? kStages - 1 : pv_stage - 1]);
      pack_p();  // P(n - 1)
      // Epilogue step 1: the previous work tile's store has read the O tile (nothing to wait for at
      // the block's first); the turn sync below carries that to the warpgroup's 128 threads.
      if (store_thread) bulk_wait_group_read<0>();
      if (rescale_o_needed) rescale_o();  // V20: before the turn, as in the loop; V22: if m moved
      named_bar_sync(my_turn, kConsumerThreads);
      batch_begin();
      issue_pv(pv_stage);
      wgmma_commit();
      if (cwg != 1 || !last_work_tile) named_bar_arrive(their_turn, kConsumerThreads);  // B's very last: no one
      wgmma_wait<0>();
      fence_regs(o_acc);
      if (lane == 0) mbar_arrive(&smem.v_empty[pv_stage]);

      // ---- O / row_sum -> the O tile (fp16, stmatrix) -> global (TMA store); the producer is loading
      //      the next tile meanwhile ---------------------------------------------------------------
      float inv[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) inv[h] = 1.f / quad_sum(row_sum[h]);
      // Step 2. stmatrix x4 number j writes head columns 16j..16j+15 of the warp's 16 rows: its four
      // 8x8 matrices are (rows 0-7, n8 block 2j), (rows 8-15, 2j), (rows 0-7, 2j + 1), (rows 8-15,
      // 2j + 1), i.e. accumulators o_acc[8j + 0..1], [8j + 2..3], [8j + 4..5], [8j + 6..7] of this
      // thread (row g or g + 8, columns 2 quad, 2 quad + 1 of the block: stmatrix's own fragment).
      // Lane l gives the address of row l % 8 of matrix l / 8: tile row st_row, 16-byte chunk
      // 2j + l / 16 of its 256 bytes, in half chunk / 8 at swizzled chunk (chunk % 8) ^ (st_row % 8).
      const int st_row = cwg * kWgRows + warp * 16 + ((lane / 8) % 2) * 8 + lane % 8;
      const uint32_t st_base = smem_addr(smem.o[0]) + st_row * kBoxRowBytes;
#pragma unroll
      for (int j = 0; j < kD / 16; ++j) {
        const int chunk = 2 * j + lane / 16;
        const uint32_t addr = st_base + (chunk / 8) * (kBr * kBoxRowBytes) + ((chunk % 8) ^ (st_row % 8)) * 16;
        stmatrix_x4(addr, pack_half2(o_acc[8 * j + 0] * inv[0], o_acc[8 * j + 1] * inv[0]),
                    pack_half2(o_acc[8 * j + 2] * inv[1], o_acc[8 * j + 3] * inv[1]),
                    pack_half2(o_acc[8 * j + 4] * inv[0], o_acc[8 * j + 5] * inv[0]),
                    pack_half2(o_acc[8 * j + 6] * inv[1], o_acc[8 * j + 7] * inv[1]));
      }
      fence_proxy_async();  // this thread's writes, visible to the TMA unit's reads
      // Step 3. all 128 threads of this warpgroup have written and fenced its 64 rows
      named_bar_sync(kOBar + cwg, 128);
      // Step 4. one thread stores the 64 rows: head columns 0-63 from half 0, 64-127 from half 1
      if (store_thread) {
        const int o_row = q_row0(w) + cwg * kWgRows;
        tma_store_2d(&tmap_o, smem.o[0] + cwg * kWgRows * kBoxCols, 0, o_row);
        tma_store_2d(&tmap_o, smem.o[1] + cwg * kWgRows * kBoxCols, kBoxCols, o_row);
        bulk_commit_group();
      }
    }
    // The block's last stores must have read the O tile before the block exits and its shared
    // memory goes to another; waiting for the whole group is as cheap and leaves nothing in flight.
    if (store_thread) bulk_wait_group<0>();
  }
}
