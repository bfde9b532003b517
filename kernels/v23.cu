// V23: the work tiles of a block run into each other (the Hopper line, tenth step; sm_90a only).
// Up to V22 a consumer warpgroup walks its block's work tiles one after the other: batch 0 issues a
// work tile's QK(0) alone and waits for it before its softmax, the last batch issues PV(n - 1) alone,
// and the epilogue follows it. At S = 1024 a work tile has 8 key tiles, so these two lone products,
// and the waits behind them, are a fifth of the batches; ncu at the case puts 6% of the warps'
// samples on the waits for a work tile's first Q and K, its lone QK(0) and its lone PV(n - 1).
// V23 numbers a block's key tiles i = 0 .. T - 1 over all its work tiles (tile i is key tile i % n
// of the block's work tile i / n, as the producer already counts them) and runs one batch per i:
// QK(i) and PV(i - 1), whether or not they belong to the same work tile. So the next work tile's
// QK(0) goes into the turn with this one's last PV, and only the block's very first and very last
// products run alone.
//   - Q has two buffers: a work tile's Q is loaded while the previous one's last QK may still read
//     the other (work tile k of the block uses buffer k % 2).
//   - A work tile's epilogue (O / row sum -> the O tile -> TMA store) runs at the top of the batch
//     that issues the next work tile's first PV: there PV(i - 2), the tile's last, is complete, and
//     the first PV of the next tile overwrites O (accumulate off for its first k-step) instead of
//     O being zeroed. The softmax of the next tile's first key tile has run by then: it keeps the
//     finished tile's row sums (row_sum_done) before it resets them.
//   - O is not rescaled before a work tile's first PV (it holds nothing of that tile yet).
//
//   The batches of consumer warpgroup c around a work-tile boundary (key tiles n - 1 | 0 of the next):
//
//     V22   .. | turn: QK(n-1); PV(n-2) | softmax(n-1) | turn: PV(n-1) | epilogue | wait Q', K'(0) | turn: QK'(0) | softmax'(0) | turn: QK'(1); PV'(0) ..
//     V23   .. | turn: QK(n-1); PV(n-2) | softmax(n-1) | turn: QK'(0); PV(n-1) | softmax'(0) | epilogue | turn: QK'(1); PV'(0) ..
//
//   384 threads = 3 warpgroups, __launch_bounds__(384, 1), setmaxnreg 24 / 240, once per block:
//     warpgroup 0      the producer: one thread issues every TMA, in V21's order (K(i), V(i - 1),
//                      and a work tile's Q after its first K), Q into buffer k % 2
//     warpgroups 1, 2  consumers A and B (consumer warpgroup c = 0, 1 owns rows 64c..64c+63), taking
//                      turns on named barriers as from V16
//   Br = 128, Bc = 128, D = 128. Shared memory: Q 2 x 32 KB, 2 K/V stages (128 KB), O 32 KB, the
//   barriers: 229,376 B and the barriers, inside the 227 KB a block may have.
//   Everything else is V22's.
//
#include <type_traits>

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
constexpr int kStages = 2;                                   // K/V ring depth
constexpr int kQBuffers = 2;                                 // V23: work tile k of a block uses Q buffer k % 2
constexpr int kHalves = kD / kBoxCols;                       // 2 boxes of 64 head columns per row
static_assert(kWgRows == 64 && kBc == 128 && kD == 128, "the wgmma shapes below are m64n128k16");

struct SharedStorage {
  half q[kQBuffers][kHalves][kBr * kBoxCols];
  half k[kStages][kHalves][kBc * kBoxCols];
  half v[kStages][kHalves][kBc * kBoxCols];
  half o[kHalves][kBr * kBoxCols];  // V19: the O tile the TMA stores read, the o map's layout
  uint64_t q_full[kQBuffers];
  uint64_t q_empty[kQBuffers];  // the consumers are done with this buffer's Q; the next one may be loaded
  uint64_t k_full[kStages];
  uint64_t v_full[kStages];
  uint64_t k_empty[kStages];
  uint64_t v_empty[kStages];
};
static_assert(offsetof(SharedStorage, q) % kAtomBytes == 0 && offsetof(SharedStorage, k) % kAtomBytes == 0 &&
                  offsetof(SharedStorage, v) % kAtomBytes == 0 && offsetof(SharedStorage, o) % kAtomBytes == 0 &&
                  (kBc * kBoxRowBytes) % kAtomBytes == 0 && (kWgRows * kBoxRowBytes) % kAtomBytes == 0,
              "every TMA box and wgmma operand starts on a 1024-byte swizzle atom");
constexpr int kQBytes = kBr * kD * sizeof(half);     // 32 KB: the expect-tx count of q_full
constexpr int kTileBytes = kBc * kD * sizeof(half);  // 32 KB: of k_full / v_full
constexpr int kSmemBytes = sizeof(SharedStorage) + kAtomBytes;  // + slack to align the base
static_assert(kSmemBytes <= 232448, "above the 227 KB of shared memory a block may opt in to on sm_90");

}  // namespace

FLASH_LAUNCH_CONTRACT_TMA_PERSISTENT_O(kThreads, kBr, kBc, kSmemBytes, kBr, kBc, kWgRows, kCtasPerSm)

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
  // This block's work tiles: first_work + kk * work_step, kk = 0 .. my_work_tiles - 1 (at least one:
  // the grid is no larger than the work).
  const int my_work_tiles = (work_tiles - first_work + work_step - 1) / work_step;
  const auto work_of = [&](int kk) { return first_work + kk * work_step; };
  // Rows of the [B*H*S, 128] view the tensor maps describe: work tile w's head's first key, its Q.
  const auto head_row0 = [&](int w) { return (w / row_tiles) * seq_len; };
  const auto q_row0 = [&](int w) { return head_row0(w) + (w % row_tiles) * kBr; };

  // ---- barriers, before the roles split ---------------------------------------------------------
  if (thread == 0) {
    tma_prefetch_map(&tmap_q), tma_prefetch_map(&tmap_k), tma_prefetch_map(&tmap_v), tma_prefetch_map(&tmap_o);
    for (int b = 0; b < kQBuffers; ++b) {
      mbar_init(&smem.q_full[b], 1);
      mbar_init(&smem.q_empty[b], kConsumerWarps);
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
      // V23: the kk-th work tile's Q goes to buffer kk % 2, its use kk / 2; from the second use on it
      // waits for the buffer's release by the work tile two before.
      const auto load_q = [&](int kk) {
        const int buffer = kk % kQBuffers, use = kk / kQBuffers;
        if (use > 0) mbar_wait(&smem.q_empty[buffer], (use - 1) & 1);
        mbar_arrive_expect_tx(&smem.q_full[buffer], kQBytes);
        tma_load_tile<kBr>(smem.q[buffer][0], &tmap_q, &smem.q_full[buffer], q_row0(work_of(kk)));
      };
      // V21: K(i), then V(i - 1), then, at a work tile's first key tile, its Q.
      int i = 0, previous_key_row = 0;
      for (int kk = 0; kk < my_work_tiles; ++kk)
        for (int tile = 0; tile < num_tiles; ++tile, ++i) {
          const int key_row = head_row0(work_of(kk)) + tile * kBc;
          load_k(i, key_row);
          if (i > 0) load_v(i - 1, previous_key_row);
          if (tile == 0) load_q(kk);
          previous_key_row = key_row;
        }
      load_v(i - 1, previous_key_row);
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
    const uint32_t q_base = smem_addr(smem.q[0]) + cwg * kWgRows * kBoxRowBytes;
    const auto qk_step = [](int ks, int rows) { return (ks / 4) * rows * kBoxRowBytes + (ks % 4) * 32; };

    float o_acc[64];               // O: 64 rows x 128 head columns per warpgroup
    float s_acc[64];               // S of the tile whose QK is in the current batch
    uint32_t p_frag[kBc / 16][4];  // P of the tile whose PV is in the current batch
    float row_max[2];  // rows g, g + 8: m, (max - m) * scale_log2 <= 8 (V22; -inf at each work tile)
    float row_sum[2] = {0.f, 0.f};  // this thread's part of the running sum of exp (0 at each work tile)
    float row_sum_done[2];  // V23: the row sums of the work tile whose epilogue is still to come

    // ---- the pieces of a batch -------------------------------------------------------------------
    // S = Q K^T: 64 rows x 128 keys per warpgroup, 8 wgmma k16 steps over the head dim, Q from buffer
    // q_buffer.
    // The descriptors of the two Q buffers' k-step 0, made once: a descriptor made from the loop
    // counter in every batch was kept in ordinary registers and moved into uniform ones (R2UR)
    // inside the turn, before each wgmma.
    const uint64_t q_desc_buffer0 = make_desc_sw128(q_base, 16, kAtomBytes);
    const uint64_t q_desc_buffer1 = make_desc_sw128(q_base + int(sizeof(smem.q[0])), 16, kAtomBytes);
    const auto issue_qk = [&](uint64_t q_desc0, int stage) {
      const uint64_t k_desc0 = make_desc_sw128(smem_addr(smem.k[stage][0]), 16, kAtomBytes);
#pragma unroll
      for (int ks = 0; ks < kD / 16; ++ks)
        wgmma_m64n128k16_ss(s_acc, desc_advance(q_desc0, qk_step(ks, kBr)), desc_advance(k_desc0, qk_step(ks, kBc)),
                            ks > 0);
    };
    // O (+)= P V: 64 rows x 128 head columns, 8 wgmma k16 steps over the keys. V is [keys][head dims]:
    // B = V with N (head dims) contiguous, MN-major; the two 64-column halves are LBO = 128 keys x
    // 128 B apart, 8-key groups SBO = 1024 B apart. V23: a work tile's first PV overwrites O.
    const auto issue_pv = [&](int stage, bool accumulate) {
      const uint64_t v_desc0 = make_desc_sw128(smem_addr(smem.v[stage][0]), kBc * kBoxRowBytes, kAtomBytes);
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk)
        wgmma_m64n128k16_rs_bt(o_acc, p_frag[kk], desc_advance(v_desc0, kk * 16 * kBoxRowBytes), kk > 0 || accumulate);
    };
    // Before a batch: the registers its wgmma write or read were last touched by ordinary code.
    const auto batch_begin = [&] {
      fence_regs(o_acc), fence_regs(s_acc);
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk) fence_regs(p_frag[kk]);
      wgmma_fence();
    };
    // After the wait for the batch's PV: O and P are this thread's again.
    const auto pv_done = [&] {
      fence_regs(o_acc);
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk) fence_regs(p_frag[kk]);
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
    // O rescaled by the factors of the last softmax (its columns are head dims, its rows the same
    // g, g + 8): once the PV before is complete, before the turn (V20).
    const auto rescale_o = [&] {
#pragma unroll
      for (int i = 0; i < 64; ++i) o_acc[i] *= rescale[(i / 2) % 2];
    };
    // Once the PV before is done with P: the next P packed as wgmma A fragments, k16 slice kk (keys
    // 16kk..) from accumulator blocks 2kk, 2kk + 1.
    const auto pack_p = [&] {
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) p_frag[kk][r] = pack_half2(s_acc[8 * kk + 2 * r], s_acc[8 * kk + 2 * r + 1]);
    };
    // The key tile i of the block: its work tile's index kk (of the block's), key tile and ring stage.
    // A work tile's first key tile resets the softmax's state, keeping the finished tile's row sums.
    const auto start_softmax = [&](int tile) {
      if (tile == 0) {
        row_sum_done[0] = row_sum[0], row_sum_done[1] = row_sum[1];
        row_max[0] = row_max[1] = -INFINITY;
        row_sum[0] = row_sum[1] = 0.f;
      }
      softmax();
    };
    // The epilogue of the block's kk-th work tile, once its last PV is complete: O / row sum -> the O
    // tile (fp16, stmatrix) -> global (TMA store).
    const auto epilogue = [&](int kk) {
      // Step 1: the previous work tile's store has read the O tile (nothing to wait for at the block's
      // first); the barrier carries that to the warpgroup's 128 threads.
      if (store_thread) bulk_wait_group_read<0>();
      named_bar_sync(kOBar + cwg, 128);
      float inv[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) inv[h] = 1.f / quad_sum(row_sum_done[h]);
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
        const int o_row = q_row0(work_of(kk)) + cwg * kWgRows;
        tma_store_2d(&tmap_o, smem.o[0] + cwg * kWgRows * kBoxCols, 0, o_row);
        tma_store_2d(&tmap_o, smem.o[1] + cwg * kWgRows * kBoxCols, kBoxCols, o_row);
        bulk_commit_group();
      }
    };

    // Key tile i of the block (numbered as the producer numbers them) is key tile `tile` of the block's
    // work tile `work`: in ring stage i % 2, the stage's use (i / 2) & 1; its Q in buffer work % 2,
    // that buffer's use (work / 2) & 1.
    struct KeyTile {
      int i, work, tile;
    };
    const auto next_of = [&](KeyTile t) {
      return t.tile + 1 == num_tiles ? KeyTile{t.i + 1, t.work + 1, 0} : KeyTile{t.i + 1, t.work, t.tile + 1};
    };
    const auto stage_of = [](const KeyTile& t) { return t.i % kStages; };
    const auto phase_of = [](const KeyTile& t) { return uint32_t(t.i / kStages) & 1; };
    // Done with t's K (after the wait for its QK), and, after a work tile's last QK, with its Q.
    const auto release_k_and_q = [&](const KeyTile& t) {
      if (lane == 0) {
        mbar_arrive(&smem.k_empty[stage_of(t)]);
        if (t.tile == num_tiles - 1) mbar_arrive(&smem.q_empty[t.work % kQBuffers]);
      }
    };
    // At the top of the batch whose PV is pv's (pv.i >= 0): the PV before complete, its V released;
    // if pv opens a work tile, the previous one is finished: its epilogue, and no rescale (pv's PV
    // overwrites O).
    const auto before_turn = [&](const KeyTile& pv) {
      wgmma_wait<0>();  // PV(pv.i - 1) complete (nothing pending at pv.i = 0)
      pv_done();
      if (pv.i > 0 && lane == 0) mbar_arrive(&smem.v_empty[(pv.i - 1) % kStages]);
      const bool opens = pv.tile == 0;
      if (opens && pv.work > 0) epilogue(pv.work - 1);
      pack_p();  // P(pv.i)
      if (rescale_o_needed && !opens) rescale_o();  // by softmax(pv.i)'s factors (V20); V22: if m moved
    };

    // ---- batch 0: QK(0) alone --------------------------------------------------------------------
    KeyTile qk{0, 0, 0};
    mbar_wait(&smem.q_full[0], 0);
    mbar_wait(&smem.k_full[0], 0);
    if (cwg != 0) named_bar_sync(my_turn, kConsumerThreads);  // A goes first, once
    batch_begin();
    issue_qk(q_desc_buffer0, 0);
    wgmma_commit();
    named_bar_arrive(their_turn, kConsumerThreads);
    wgmma_wait<0>();
    fence_regs(s_acc);
    release_k_and_q(qk);
    start_softmax(qk.tile);

    // ---- batches 1 .. T - 1: QK(i), then PV(i - 1), two commit groups (V17's rotated loop) -------
    // One batch: QK of the key tile after qk, whose Q is in buffer kQBuffer, and PV of qk. Two kinds:
    //   - a work tile's first two key tiles: the batch may wait for a new Q, run the epilogue of the
    //     previous work tile, open O with its first PV; it checks for each at run time;
    //   - the rest (key tiles 2 .. n - 1): none of these can happen, and the batch is V22's, with no
    //     check in it. In one kind for all batches, the checks cost 7-10% at every S (a wider,
    //     branchier loop around the same turn), more than the overlap won.
    // The buffer is a compile-time constant too (the loop below runs the work tiles two at a time),
    // so that both buffers' descriptors stay in uniform registers as V22's one does; chosen at run
    // time, the descriptor was kept in ordinary registers and moved into uniform ones (R2UR) between
    // the wgmma of the turn.
    const auto batch = [&](auto q_buffer, auto lean) {
      constexpr int kQBuffer = decltype(q_buffer)::value;
      constexpr bool kLean = decltype(lean)::value;
      const KeyTile pv = qk;
      qk = kLean ? KeyTile{qk.i + 1, qk.work, qk.tile + 1} : next_of(qk);
      if (!kLean && qk.tile == 0) mbar_wait(&smem.q_full[kQBuffer], uint32_t(qk.work / kQBuffers) & 1);
      mbar_wait(&smem.k_full[stage_of(qk)], phase_of(qk));
      mbar_wait(&smem.v_full[stage_of(pv)], phase_of(pv));
      if (kLean) {  // V22's top of a batch
        wgmma_wait<0>();  // PV(i - 2) complete
        pv_done();
        if (lane == 0) mbar_arrive(&smem.v_empty[(pv.i - 1) % kStages]);
        if (rescale_o_needed) rescale_o();
        pack_p();  // after the rescale's branch: before it, ptxas sank the packing into the turn
      } else {
        before_turn(pv);
      }
      named_bar_sync(my_turn, kConsumerThreads);
      batch_begin();  // one fence for both products: P and O were written by ordinary instructions
      issue_qk(kQBuffer == 0 ? q_desc_buffer0 : q_desc_buffer1, stage_of(qk));
      wgmma_commit();
      issue_pv(stage_of(pv), kLean || pv.tile != 0);
      wgmma_commit();
      named_bar_arrive(their_turn, kConsumerThreads);
      wgmma_wait<1>();  // QK complete; PV may still run
      fence_regs(s_acc);
      release_k_and_q(qk);
      if (kLean)
        softmax();  // overlaps PV
      else
        start_softmax(qk.tile);
    };
    using Buffer0 = std::integral_constant<int, 0>;
    using Buffer1 = std::integral_constant<int, 1>;
    using Checked = std::false_type;
    using Lean = std::true_type;
    const int checked_tiles = num_tiles < 2 ? num_tiles : 2;
    for (int work = 0; work < my_work_tiles; work += 2) {
      for (int tile = work == 0 ? 1 : 0; tile < checked_tiles; ++tile) batch(Buffer0{}, Checked{});
      for (int tile = 2; tile < num_tiles; ++tile) batch(Buffer0{}, Lean{});
      if (work + 1 < my_work_tiles) {
        for (int tile = 0; tile < checked_tiles; ++tile) batch(Buffer1{}, Checked{});
        for (int tile = 2; tile < num_tiles; ++tile) batch(Buffer1{}, Lean{});
      }
    }

    // ---- batch T: PV(T - 1) alone, then the block's last epilogue ----------------------------------
    mbar_wait(&smem.v_full[stage_of(qk)], phase_of(qk));
    before_turn(qk);
    named_bar_sync(my_turn, kConsumerThreads);
    batch_begin();
    issue_pv(stage_of(qk), qk.tile != 0);
    wgmma_commit();
    if (cwg != 1) named_bar_arrive(their_turn, kConsumerThreads);  // B's very last: no one waits for it
    wgmma_wait<0>();
    pv_done();
    if (lane == 0) mbar_arrive(&smem.v_empty[stage_of(qk)]);
    row_sum_done[0] = row_sum[0], row_sum_done[1] = row_sum[1];
    epilogue(qk.work);
    // The block's last stores must have read the O tile before the block exits and its shared
    // memory goes to another; waiting for the whole group is as cheap and leaves nothing in flight.
    if (store_thread) bulk_wait_group<0>();
  }
}
