// V25: V24's schedule as one kernel over its configuration: a causal mask or none, fp16 or bf16, grouped
// K/V heads, and any S (the Hopper line, twelfth step; sm_90a only).
// Configuration, at compile time: FLASH_CAUSAL (0 or 1; keys after each query are masked), FLASH_BF16
// (0: fp16 Q, K, V and O, 1: bf16; the wgmma's input type, P's and O's rounding), FLASH_GROUPED_KV (1:
// K and V have H / kv_group heads, kv_group the query heads that read one K/V head, given at launch: 2
// to H, MQA at H; 0: one K/V head per query head, kv_group 1) and FLASH_HEAD_DIM, D (128; 64: one
// 64-column box a row, PV on wgmma m64n64k16, 32 accumulators of O a thread, and three consumer
// warpgroups, row tiles of 192; 256: four boxes, PV on m64n256k16, 128 accumulators of O a thread, key
// tiles of 64 and one O tile for both consumers; the schedule otherwise the same).
// Choice: at D = 64 three consumer warpgroups (FlashAttention-3's 192 rows there), not two: a key tile's
//   two products take half D = 128's tensor time and its exponentials the same, so with two consumers
//   each batch pair took 1912 cycles at S = 16384 where either pipe needs 1024 (MUFU 55% busy). With
//   three, while one issues its products the two others run their softmax: 12436k cycles at S = 16384
//   against 15240k (-18%), 863.5k against 1005.5k at 4096, 71.1k against 76.7k at 1024 (NOTES). The
//   cost: 160 registers a consumer (512 threads), and ptxas keeps two values of the rare path's mask
//   after a recompute in local memory (8 bytes, in the first entry only; none under the mask, where a
//   row tile of 192 rows is one and a half key tiles of 128, its diagonal in its last two); the grouped
//   build's second entry keeps 4 bytes more, one store and one load a work tile (in its epilogue).
// Choice: at D = 256 key tiles of 64 keys (Bc = 64), not 128: O's 128 accumulators, S's 64 and P's 32
//   would pass the consumers' 240 registers (FlashAttention-3 takes 80 keys there); and one O tile of 64
//   rows that the consumers take in turns, not one of 128 rows: Q (64 KB), two K/V stages (128 KB) and a
//   128-row O tile (64 KB) pass the 227 KB of shared memory. A consumer writes the O tile once the other's
//   store has read it (the o_read barrier): its last PV is half a batch after the other's, so that wait
//   is rarely a wait at all. Under the mask a row tile's diagonal crosses its last two key tiles, both
//   masked; consumer A's rows see none of the last one's keys (its max from the tiles before).
// Choice: grouped K/V heads a build of their own, not every build's: in the fp16 build a K/V head held
//   beside the Q head (even head + 1) had ptxas serialise every wgmma of the ragged-first entry (C7511),
//   its turns 39, 88, 49 SASS instructions long becoming 121, 317, 278, and a guard that traps on a
//   kv_group other than 1 did the same to the causal build's; so the builds without the parameter ignore
//   kv_group, and the grouped build works out each K and V load's head where it loads (the producer's).
// Any S: Q, K, V and O are read and written through 4-D tensor maps by head ({D, S, H, B}), whose
// bound on S fills a box that reaches past the last row with zeros and clips the O stores; keys at
// or past S are masked in the last key tile.
// Two entries: flash_attention_forward for every S but those whose last key tile holds 1 to 32 keys,
// and flash_attention_forward_ragged_first for those (the launch picks by the contract's
// ragged_first): there the key tiles are laid out from S's end, so that the part tile is every work
// tile's key tile 0, whose QK (wgmma N = 32) and softmax take its keys alone, and under the mask the
// row tiles with them, so that rows and keys keep their places on the grid of whole tiles, each diagonal
// crossing the key tiles it crosses in the first entry (see `attention`).
// Choice: a second entry, not a choice by width inside the kernel: a branch by width in batch 0
//   serialises every wgmma (ptxas C7515), and the consumers' loop made once per width, chosen once,
//   slowed the whole-tile copy by 3.3-6.7% at S = 512-4096 (NOTES), while the narrow tile made S = 4000
//   2.0% cheaper than 4096. As an entry of its own the first entry is V25's code instruction for
//   instruction, and its ragged tile is its own.
// Choice: under the mask, row tile 0 (rows -(Bc - r) .. Br - (Bc - r) - 1) has its rows at or past 0 (and
//   before S) copied from the O tile by its warpgroup's threads: a TMA store whose box starts before
//   row 0 is an illegal instruction on the H200, partly out of bounds or wholly. Copied from the O
//   tile, not stored from the accumulators: with stores from the accumulators ptxas gave the softmax's
//   two -m registers of one bank, and every batch after the narrow QK(0) ran 6% slower, S = 4000 651.2k
//   cycles against the first entry's 641.0k; copied, 623.4k against 641.4k (NOTES).
// Causal: row tile r (rows Br r..Br r + Br - 1) needs the key tiles up to its last row's only, 0..r at
// Br = Bc, 0..2r + 1 at D = 256's Bc = Br / 2, 0..ceil(1.5 (r + 1)) - 1 at D = 64's Bc = Br / 1.5: the
// tiles wholly above the diagonal are never loaded or multiplied, and the mask is applied on the
// diagonal's tiles alone (the last one or two of a work tile).
// Work tiles: each block walks the list the launch made for its grid (hopper.cuh's WorkList,
//   flashbench/work_list.py): longest first, in sections of heads whose K and V fit in
//   kL2SectionBytes of L2 under the mask (one head a section without it: V24's order, the row tiles
//   from the last), each work tile to the block that frees first. A block's first work tile and its
//   count are read in one round trip at the kernel's top, under the barriers' set-up; each work tile
//   names its row tile, head and batch (no division).
// Choice: under the mask, a list made at launch, not rounds of the grid's blocks: fixed rounds (in a
//   snake) with 32 MB sections took 25% more cycles at S = 4096 than with 128 MB (NOTES), as they left
//   the most loaded block 29% above the mean there; by the list's cost model, each work tile to the
//   block that frees first is within 1% of the mean at S >= 4096 for any section size, so the sections
//   can be sized to L2. Measured by ncu at B = 1, H = 64 under the mask (NOTES): against the rounds
//   with 128 MB sections, the list with 16 MB sections read 204 MB from DRAM at S = 4096 where they
//   read 1138 MB (FlashAttention's kernel 242 MB), 0.82 GB at 16384 against 8.55 GB, in 6.0% and
//   2.3% fewer cycles; with 32 MB sections 324 MB and 1.32 GB (5.3%, 2.3% fewer).
// Choice: a work tile's last key tile peeled out of the loop (its batch a lambda made twice, the mask
//   compiled out of the loop's copy), and the rare path's S multiplied again in a rolled loop into a
//   local array (local memory, off the main path), so that each copy of a batch stays small: 3864
//   SASS instructions (in a3b032a's one entry; the first entry is 3784 now), against 4600 with the mask in
//   the loop behind a branch. Measured by cycles at
//   B = 1, H = 64 against that build (NOTES): without the mask 2.1% fewer at S = 1024, 1.1% more at
//   4096 and 1.3% fewer at 16384; under it 4-8% fewer. A peel that kept the rare path's 64 unrolled
//   dot products in both copies (7096 instructions) took 6.6% more at S = 1024.
//
//   384 threads = 3 warpgroups, __launch_bounds__(384, 1), setmaxnreg 24 / 240, once per block (at D = 64
//   512 threads = 4 warpgroups, setmaxnreg 24 / 160);
//   the persistent grid: one block per SM, walking the work tiles (row tile, head) its list names
//
//   warpgroup 0, one thread: the producer. For each of its work tiles, n = the key tiles it reads
//   (K and V of its head's K/V head, head / kv_group):
//     K(0) | Q_A, Q_B (, Q_C) | K(1) V(0) | K(2) V(1) | .. | K(n-1) V(n-2) | (next work tile) .. | V(last)
//     each K/V load waits for its ring stage's empty barrier (2 stages each of K and V), each
//     warpgroup's rows of Q for its q_empty (the previous work tile's last QK has read them)
//   warpgroups 1, 2: consumers A and B, 64 query rows each, taking turns on the tensor cores
//     (named barriers turn[A], turn[B]; B half a batch behind A; at D = 64 warpgroups 1-3, consumers A,
//     B and C in a ring of turns, each a third of a batch behind the one before):
//       wait Q | batch 0: QK(0) (32 keys wide in the ragged-first entry) | softmax(0)
//       batch j = 1 .. n-1: wait K(j), V(j-1) | pack P(j-1), rescale O | turn: QK(j), PV(j-1) |
//                           softmax(j) overlapping PV(j-1); release K(j), V(j-2)
//       batch n: PV(n-1) | release V(n-1), and Q after the last QK
//       epilogue: O / row sums -> the O tile (stmatrix) -> TMA store of the warpgroup's 64 rows
//                 (causal row tile 0 of the ragged-first entry: its rows from 0 copied by 128 threads)
//     softmax(j) masks first on a tile the diagonal or S crosses; it takes exp against the running
//     m (V23), moves m only past 2^8 (V22), and multiplies S again on the FMA pipe where P overflows.
//   Br = 128 (192 at D = 64), Bc = 128 (64 at D = 256). Shared memory at D = 128: Q 32 KB, 2 K/V stages
//   (128 KB), O 32 KB, the barriers (at D = 64 Q 24 KB, 2 K/V stages 64 KB, O 24 KB; at D = 256 Q 64 KB,
//   2 K/V stages of 64 keys 128 KB, O 32 KB).
//
#include <climits>      // INT_MAX: a mask with no end
#include <type_traits>  // std::integral_constant: a batch's compile-time mask flag

#include "hopper.cuh"

#ifndef FLASH_CAUSAL
#define FLASH_CAUSAL 0
#endif
#ifndef FLASH_BF16
#define FLASH_BF16 0
#endif
#ifndef FLASH_GROUPED_KV
#define FLASH_GROUPED_KV 0
#endif
#ifndef FLASH_HEAD_DIM
#define FLASH_HEAD_DIM 128
#endif

using namespace flash;
using namespace flash::hopper;

namespace {

constexpr bool kCausal = FLASH_CAUSAL;
using Element = std::conditional_t<FLASH_BF16, __nv_bfloat16, half>;  // of Q, K, V, O and P
constexpr bool kGroupedKv = FLASH_GROUPED_KV;
constexpr int kD = FLASH_HEAD_DIM;                           // 128, 64 or 256: PV's wgmma N
constexpr int kCtasPerSm = 1;                                // the persistent grid: one block per SM
constexpr int kConsumerWarpgroups = kD == 64 ? 3 : 2;        // taking turns on the tensor cores
constexpr int kThreads = 128 * (1 + kConsumerWarpgroups);    // 384 (512 at D = 64)
constexpr int kConsumerThreads = kConsumerWarpgroups * 128;
constexpr int kConsumerWarps = kConsumerWarpgroups * 4;      // the arrival count of an empty barrier
constexpr int kTurnBar = 1;                                  // turn[c] is named barrier 1 + c
constexpr int kTurnThreads = 256;                            // its arrivals: c's sync and the one before c's arrive
constexpr int kOBar = kTurnBar + kConsumerWarpgroups;        // o_bar[c] is named barrier kOBar + c (128 threads)
constexpr int kProducerRegs = 24;                            // setmaxnreg.dec of warpgroup 0
constexpr int kConsumerRegs = kConsumerWarpgroups == 3 ? 160 : 240;  // setmaxnreg.inc of the consumers
// setmaxnreg only moves registers within what the block was given at launch: the launch bound's share of
// the 64K register file, in steps of 8 per thread (64512 at 384 threads, 65536 at 512). A consumer asking
// for more than is left waits at setmaxnreg.inc for ever.
constexpr int kBlockRegs = kThreads * (65536 / kThreads / 8 * 8);
static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kBlockRegs, "the block's registers");
constexpr int kWgRows = 64;                                  // rows per consumer warpgroup: one wgmma M
constexpr int kBr = kWgRows * kConsumerWarpgroups;           // query rows per work tile (128; 192 at D = 64)
constexpr int kBc = kD == 256 ? 64 : 128;                    // keys per K/V tile: one wgmma N (QK)
constexpr float kRescaleLog2 = 8.f;                          // V22: m moves when (max - m) * scale_log2 > 8
constexpr float kRescaleP = 256.f;                           // V23: the same, seen on P: P > 2^8
constexpr int kStages = 2;                                   // K/V ring depth
constexpr int kBoxes = kD / kBoxCols;                        // 2 boxes of 64 head columns per row (1 at D = 64, 4 at 256)
constexpr bool kSharedOTile = kD == 256;                     // one O tile of 64 rows, the consumers' in turns
constexpr int kORows = kSharedOTile ? kWgRows : kBr;         // the O tile's rows
constexpr int kL2SectionBytes = kCausal ? 16 << 20 : 0;     // K and V of a section of heads (0: one head)
constexpr int kRaggedFirstKeys = 32;                         // the entry ..._ragged_first takes 0 < S mod Bc <= this
static_assert(kD == 128 || kD == 64 || kD == 256,
              "the wgmma shapes below: QK m64n128k16 (m64n64k16 at D = 256), PV m64nDk16");
static_assert(!kCausal || (2 * kBr) % kBc == 0,
              "under the mask every row tile's diagonal crosses its last ceil(Br / Bc) key tiles: Br a whole or "
              "half-whole number of key tiles (at Br = 1.5 Bc, row tile r's diagonal is key tiles "
              "floor(1.5 r) .. ceil(1.5 (r + 1)) - 1, two at every r)");
// The key tiles at a work tile's end a mask may cross: under the mask its diagonal's, else the one S ends in.
constexpr int kMaskedTiles = kCausal ? (kBr + kBc - 1) / kBc : 1;
// Choice: at D = 64 under the mask (160 registers a consumer), the rare path's S masked in local memory
//   in a rolled loop before it is copied to s_acc, not unrolled in s_acc after: there the 64 more tests
//   had ptxas keep a row sum in local memory through every batch (60 bytes spilled in the first entry,
//   84 in the second), and place the mask's predicates among the wgmma of the second entry's masked
//   turn (371 SASS instructions from its sync up to its arrive, the arrive left out, against 103). Elsewhere in s_acc: masked in
//   local memory, the grouped causal build at D = 128 had the wgmma of its second entry serialised (a
//   wait after each, with no ptxas warning), and D = 64 without the mask a longer turn in its loop (91
//   instructions against 86, counted alike).
constexpr bool kMaskRolled = kCausal && kConsumerWarpgroups == 3;
static_assert(!kSharedOTile || kConsumerWarpgroups == 2,
              "a shared O tile goes from one consumer to the other, one store or copy each a work tile");

struct SharedStorage {
  Element q[kBoxes][kBr * kBoxCols];
  Element k[kStages][kBoxes][kBc * kBoxCols];
  Element v[kStages][kBoxes][kBc * kBoxCols];
  Element o[kBoxes][kORows * kBoxCols];   // the O tile the TMA stores read, the o map's layout
  uint64_t q_full[kConsumerWarpgroups];   // consumer warpgroup c's 64 rows of Q have landed
  uint64_t q_empty[kConsumerWarpgroups];  // warpgroup c is done with its rows; the next may be loaded
  uint64_t k_full[kStages];
  uint64_t v_full[kStages];
  uint64_t k_empty[kStages];
  uint64_t v_empty[kStages];
  uint64_t o_read;  // with kSharedOTile: a store of the O tile has read it (the other consumer may write it)
};
static_assert(offsetof(SharedStorage, q) % kAtomBytes == 0 && offsetof(SharedStorage, k) % kAtomBytes == 0 &&
                  offsetof(SharedStorage, v) % kAtomBytes == 0 && offsetof(SharedStorage, o) % kAtomBytes == 0 &&
                  (kBc * kBoxRowBytes) % kAtomBytes == 0 && (kWgRows * kBoxRowBytes) % kAtomBytes == 0,
              "every TMA box and wgmma operand starts on a 1024-byte swizzle atom");
constexpr int kQRowsBytes = kWgRows * kD * sizeof(Element);  // 16 KB at D = 128: the expect-tx count of q_full[c]
constexpr int kTileBytes = kBc * kD * sizeof(Element);       // 32 KB at D = 128: of k_full / v_full
constexpr int kSmemBytes = sizeof(SharedStorage) + kAtomBytes;  // + slack to align the base
static_assert(kSmemBytes <= 232448, "above the 227 KB of shared memory a block may opt in to on sm_90");

// Key tiles row tile r reads: every one, or under the mask those up to its diagonal (its last row's).
__device__ __forceinline__ int key_tiles(int row_tile, int seq_len) {
  const int all = (seq_len + kBc - 1) / kBc;
  const int to_diagonal = kBr % kBc == 0 ? (row_tile + 1) * (kBr / kBc) : ((row_tile + 1) * kBr + kBc - 1) / kBc;
  return kCausal ? min(to_diagonal, all) : all;
}

// The rows from row tile 0's first to S's end, which the launch's row tiles cover: S, or in the
// ragged-first entry under the mask also the Bc - S mod Bc before row 0 (attention's row_shift), which
// add a row tile at some S only where Bc does not divide Br (an S below 1 is passed on, for the trap).
template <bool kRaggedFirst>
__device__ __forceinline__ int rows_from_first_row_tile(int seq_len) {
  return kCausal && kRaggedFirst && kBr % kBc != 0 && seq_len > 0 ? seq_len + kBc - seq_len % kBc : seq_len;
}

}  // namespace

FLASH_LAUNCH_CONTRACT_HEAD_MAPS(kThreads, kBr, kBc, kSmemBytes, kD, kWgRows, kBc, kWgRows, kCtasPerSm, kCausal,
                                kL2SectionBytes, kRaggedFirstKeys, FLASH_BF16, kGroupedKv)

// The kernel, in two entries (below): kRaggedFirst where S ends in the first quarter of a key tile.
template <bool kRaggedFirst>
__device__ __forceinline__ void attention(int seq_len, float scale_log2, const CUtensorMap& tmap_q,
                                          const CUtensorMap& tmap_k, const CUtensorMap& tmap_v,
                                          const CUtensorMap& tmap_o, int row_tiles, int batch_heads, int heads,
                                          int kv_group, const int4* __restrict__ work_list, Element* __restrict__ o) {
  const WorkList::Head list_head = WorkList::head_of_this_block(work_list);  // in flight under the set-up
  require_head_tiles_cover(rows_from_first_row_tile<kRaggedFirst>(seq_len), row_tiles, batch_heads, heads,
                           kGroupedKv ? kv_group : 1, kBr);

  // Where the key tiles start. Row tile r is rows Br r .. (rows past S fill with zeros, their O stores
  // clip). Without kRaggedFirst, key tile c is keys Bc c .. (the tile S ends in masked past S). With it
  // (r = S mod Bc, 1 to 32), key tile 0 is keys 0 .. r - 1, loaded from key 0 (keys r .. 31 of its
  // narrow QK are masked: key tile 1's), and key tile c >= 1 keys Bc c - (Bc - r) ..: the ragged part
  // is every work tile's batch 0, whose QK is 32 keys wide. Under the mask the row tiles shift the same
  // way (row tile 0 is rows -(Bc - r) .. Br - (Bc - r) - 1, its Q before row 0 filled with zeros), so that
  // rows and keys keep their places on the grid of whole tiles, and each row tile's diagonal the key tiles
  // it crosses without kRaggedFirst; row tile 0's rows at or past 0 are copied from the O tile (where Br
  // is not Bc, those before S alone: at S = r, D = 256's last 64 rows are past it). The row tiles then
  // cover the S + (Bc - r) rows from -(Bc - r): as many as S's where Bc divides Br, one more at some S
  // where Br = 1.5 Bc (D = 64; the launcher's row_tiles counts them, rows_from_first_row_tile above).
  const int key_shift = kRaggedFirst ? kBc - seq_len % kBc : 0;
  const int row_shift = kCausal ? key_shift : 0;
  const auto key_start = [&](int tile) { return kRaggedFirst && tile > 0 ? tile * kBc - key_shift : tile * kBc; };

  extern __shared__ unsigned char smem_raw[];
  SharedStorage& smem =
      *reinterpret_cast<SharedStorage*>(smem_raw + (kAtomBytes - smem_addr(smem_raw) % kAtomBytes) % kAtomBytes);

  const int thread = threadIdx.x, wg = thread / 128, warp = (thread / 32) % 4, lane = thread % 32;

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
    if (kSharedOTile) mbar_init(&smem.o_read, 1);
    mbar_fence_init();
  }
  const WorkList work = WorkList::of_this_block(work_list, list_head, row_tiles * batch_heads, heads);
  __syncthreads();  // the last block-wide barrier: after it, each role goes its own way

  if (wg == 0) {
    // ==== producer warpgroup: one thread issues every load =========================================
    setmaxnreg_dec<kProducerRegs>();
    if (warp == 0 && elect_lane0()) {
      Ring<kStages> k_ring, v_ring;
      // K and V of a work tile are its K/V head's, head / kv_group: the high word of head * ceil(2^32 /
      // kv_group), exact while head * kv_group < 2^32 (the launch holds the heads per batch to 2^16), worked
      // out before the empty barrier's wait (the empty asm keeps it there), so that the load issues the
      // moment its stage frees: this producer is on the critical path. An integer division after the wait
      // took 5% more cycles at S = 4096 and 16384, as did a float multiply (its conversions) before or after
      // it; the multiply after the wait, or the K/V head held beside the Q head for the work tile, had
      // ptxas serialise the ragged-first entry's wgmma (C7511) (NOTES).
      const uint32_t kv_magic = 0xFFFFFFFFu / uint32_t(kv_group) + 1;
      const auto kv_head = [&](int head) {
        const int kv = kGroupedKv && kv_group > 1 ? int(__umulhi(uint32_t(head), kv_magic)) : head;
        asm volatile("" ::"r"(kv));
        return kv;
      };
      const auto load_k = [&](const WorkTile& t, int tile) {
        const int head = kv_head(t.head);
        mbar_wait(&smem.k_empty[k_ring.stage], k_ring.phase ^ 1);
        mbar_arrive_expect_tx(&smem.k_full[k_ring.stage], kTileBytes);
        tma_load_head_tile<kBc, kD>(smem.k[k_ring.stage][0], &tmap_k, &smem.k_full[k_ring.stage], key_start(tile), head,
                                t.batch);
        k_ring.advance();
      };
      const auto load_v = [&](const WorkTile& t, int tile) {
        const int head = kv_head(t.head);
        mbar_wait(&smem.v_empty[v_ring.stage], v_ring.phase ^ 1);
        mbar_arrive_expect_tx(&smem.v_full[v_ring.stage], kTileBytes);
        tma_load_head_tile<kBc, kD>(smem.v[v_ring.stage][0], &tmap_v, &smem.v_full[v_ring.stage], key_start(tile), head,
                                t.batch);
        v_ring.advance();
      };
      uint32_t q_phase = 0;  // parity of the block's current work tile
      // warpgroup c's rows (every 64-column box of them) once c is done with its rows of the last Q
      const auto load_q = [&](const WorkTile& t) {
        for (int c = 0; c < kConsumerWarpgroups; ++c) {
          const int row = t.row_tile * kBr + c * kWgRows - row_shift;
          mbar_wait(&smem.q_empty[c], q_phase ^ 1);
          mbar_arrive_expect_tx(&smem.q_full[c], kQRowsBytes);
#pragma unroll
          for (int box = 0; box < kBoxes; ++box)
            tma_load_4d(smem.q[box] + c * kWgRows * kBoxCols, &tmap_q, &smem.q_full[c], box * kBoxCols, row, t.head,
                        t.batch);
        }
        q_phase ^= 1;
      };
      // K(j), then V(j - 1), then, at a work tile's first key tile, its Q (A's rows, then B's, C's).
      WorkTile previous{};
      int previous_tile = -1;  // the key tile whose V is still to load
      for (int round = 0; round < work.count; ++round) {
        const WorkTile t = work.tile(round);
        for (int tile = 0; tile < key_tiles(t.row_tile, seq_len); ++tile) {
          load_k(t, tile);
          if (previous_tile >= 0) load_v(previous, previous_tile);
          if (tile == 0) load_q(t);
          previous = t, previous_tile = tile;
        }
      }
      if (previous_tile >= 0) load_v(previous, previous_tile);
    }
  } else {
    // ==== consumer warpgroups =====================================================================
    setmaxnreg_inc<kConsumerRegs>();
    // Consumer warpgroup 0 (A), 1 (B) or 2 (C): rows 64 cwg.. Read through a shuffle from lane 0, so that
    // the compiler keeps it, and the Q descriptor made from it, in uniform registers (V20).
    const int cwg = __shfl_sync(0xffffffff, wg - 1, 0);
    // The next in the ring of turns (1 - cwg of two: the form the builds of two consumers had, and keep)
    const int my_turn = kTurnBar + cwg,
              their_turn = kTurnBar + (kConsumerWarpgroups == 2 ? 1 - cwg : (cwg + 1) % kConsumerWarpgroups);
    // The thread that issues (and waits for) this warpgroup's O stores; asked where it is needed, as a
    // flag held over the work tile loop would be the one value the registers of the D = 128 build spill.
    const auto store_thread = [] { return threadIdx.x % 128 == 0; };
    const int g = lane / 4, quad = lane % 4;

    // wgmma descriptors of k-step 0. QK's k-step ks reads head columns 16ks..: box ks / 4, 32
    // bytes per k-step inside it. PV's k-step kk reads keys 16kk..: 16 rows of 128 bytes further.
    const uint64_t q_desc0 = make_desc_sw128(smem_addr(smem.q[0]) + cwg * kWgRows * kBoxRowBytes, 16, kAtomBytes);
    const auto qk_step = [](int ks, int rows) { return (ks / 4) * rows * kBoxRowBytes + (ks % 4) * 32; };

    float o_acc[kD / 2];  // O: 64 rows x D head columns per warpgroup (zeroed at each work tile)
    float s_acc[kBc / 2];          // S of the tile whose QK is in the current batch
    uint32_t p_frag[kBc / 16][4];  // P of the tile whose PV is in the current batch
    float row_max[2];  // rows g, g + 8: m, (max - m) * scale_log2 <= 8 (V22; -inf at each work tile)
    float row_sum[2];  // this thread's part of the running sum of exp (0 at each work tile)

    // ---- the pieces of a batch -------------------------------------------------------------------
    // S = Q K^T: 64 rows x `keys` keys per warpgroup (Bc, or 32 where key tile 0 is ragged, when it
    // writes s_acc[0 .. 16) alone), D / 16 wgmma k16 steps over the head dim.
    const auto issue_qk = [&](int stage, auto keys) {
      constexpr int kKeys = decltype(keys)::value;
      static_assert(kKeys == kBc || kKeys == 32, "QK of a whole key tile, or of its first 32 keys");
      const uint64_t k_desc0 = make_desc_sw128(smem_addr(smem.k[stage][0]), 16, kAtomBytes);
#pragma unroll
      for (int ks = 0; ks < kD / 16; ++ks) {
        const uint64_t a = desc_advance(q_desc0, qk_step(ks, kBr)), b = desc_advance(k_desc0, qk_step(ks, kBc));
        wgmma_m64k16_ss<Element>(*reinterpret_cast<float(*)[kKeys / 2]>(s_acc), a, b, ks > 0);
      }
    };
    // O += P V: 64 rows x D head columns, Bc / 16 wgmma k16 steps over the keys, each one wgmma of N = D.
    // V is [keys][head dims]: B = V with N (head dims) contiguous, MN-major; its 64-column boxes are
    // LBO = Bc keys x 128 B apart, 8-key groups SBO = 1024 B apart.
    // Choice: at D = 256 one wgmma of N = 256 a k-step, not two of N = 128 on O's halves: 0.6%, 0.7% and
    //   0.1% fewer cycles at S = 1024, 4096 and 16384 (NOTES).
    const auto issue_pv = [&](int stage) {
      const uint64_t v_desc0 = make_desc_sw128(smem_addr(smem.v[stage][0]), kBc * kBoxRowBytes, kAtomBytes);
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk)
        wgmma_m64k16_rs_bt<Element>(o_acc, p_frag[kk], desc_advance(v_desc0, kk * 16 * kBoxRowBytes), 1);
    };
    using AllKeys = std::integral_constant<int, kBc>;  // QK's width (wgmma N) on a whole key tile
    using RaggedKeys = std::integral_constant<int, kRaggedFirstKeys>;  // on a ragged key tile 0
    // Before a batch: the registers its wgmma write or read were last touched by ordinary code (of S,
    // those a QK of `keys` keys writes).
    const auto batch_begin = [&](auto keys) {
      fence_regs(o_acc), fence_regs(*reinterpret_cast<float(*)[decltype(keys)::value / 2]>(s_acc));
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk) fence_regs(p_frag[kk]);
      wgmma_fence();
    };
    // The mask on S (s_acc[4i + 2h + e]: row g + 8h of the warp's 16, key 8i + 2 quad + e), over the
    // accumulators a QK of `keys` keys wrote: -inf on keys at or past the tile's end (S; with
    // kRaggedFirst, key tile 0's key r), and under the causal mask on keys after the row. Only where the
    // diagonal or the end crosses a tile: a work tile's last kMaskedTiles (mask_last: the diagonal's, and
    // without kRaggedFirst the tile S ends in) and with kRaggedFirst its first. Rows and keys are placed
    // on the grid of whole tiles (with kRaggedFirst, key tile 0's keys in its last r places, and under the
    // mask each row key_shift places on), where the diagonal and the ends are as without kRaggedFirst.
    // `first`: key tile 0 (std::true_type). Every row at or past 0 keeps a key of key tile 0, the first
    // it reads, so its max is finite before a tile masks it whole (where Br is not Bc, A's rows in the
    // last).
    const bool mask_last = kCausal || (!kRaggedFirst && seq_len % kBc != 0);
    // `s`: s_acc (by constant indices, unrolled), or with `rolled` the rare path's S in local memory.
    const auto mask_s = [&](int row_tile, int tile, auto keys, auto first, float (&s)[kBc / 2], auto rolled) {
      constexpr bool kRaggedTile = kRaggedFirst && decltype(first)::value;
      constexpr int kUnroll = decltype(rolled)::value ? 1 : decltype(keys)::value / 2;
      const int row0 = row_tile * kBr + cwg * kWgRows + warp * 16 + g;
      const int key0 = tile * kBc + 2 * quad + (kRaggedTile ? key_shift : 0);
      const int end = kRaggedFirst ? (kRaggedTile ? kBc : INT_MAX) : seq_len;  // INT_MAX: no end crosses it
#pragma unroll kUnroll
      for (int i = 0; i < decltype(keys)::value / 2; ++i) {
        const int row = row0 + 8 * ((i / 2) % 2), key = key0 + 8 * (i / 4) + i % 2;
        if (key >= end || (kCausal && key > row)) s[i] = -INFINITY;
      }
    };
    // Online softmax of S in registers (a thread holds a quarter of the Bc columns of rows g, g + 8). It
    // leaves exp(S - m) in s_acc and the factors O is to be rescaled by in rescale[]: O itself may
    // still be in flight. row_max holds m, which moves to the running max only when (max - m) *
    // scale_log2 > kRescaleLog2 (always at a work tile's first tile, where m = -inf);
    // rescale_o_needed: whether any row of this warp moved its m, the same in every lane.
    float rescale[2];
    bool rescale_o_needed = true;
    // Over the accumulators a QK of `keys` keys wrote; the others hold P = 0 already.
    const auto softmax = [&](auto keys) {
      constexpr int kLive = decltype(keys)::value / 2;
      float neg_max_scaled[2];
      bool moved = false;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int i = 0; i < kLive / 4; ++i) tile_max = fmaxf(tile_max, fmaxf(s_acc[4 * i + 2 * h], s_acc[4 * i + 2 * h + 1]));
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
      for (int i = 0; i < kLive; ++i) {
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
      for (int i = 0; i < kBc / 2; ++i) {
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
          for (int i = 0; i < kBc / 8; ++i) m = fmaxf(m, fmaxf(s_acc[4 * i + 2 * h], s_acc[4 * i + 2 * h + 1]));
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
          for (int i = 0; i < kBc / 2; ++i) s_acc[i] *= rescale[(i / 2) % 2];
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) row_sum[h] = row_sum[h] * rescale[h] + tile_sum[h];
      return true;
    };
    // This thread's Bc / 2 elements of S = Q K^T for K/V stage `stage`, on the FMA pipe from the swizzled
    // tiles (hopper.cuh's layout): the rare path of softmax_against_m, taken by a whole warp.
    // Rolled: one dot product's loop for all its outputs, into `fresh` (local memory: this path is
    // rare), copied into s_acc by constant indices so that s_acc stays in registers. On a key tile the
    // mask may cross (`masked`, batch's) masked again: in s_acc, or at D = 64 under the mask in `fresh`
    // (kMaskRolled).
    const auto recompute_s = [&](int stage, int row_tile, int tile, auto masked) {
      float fresh[kBc / 2];
#pragma unroll 1
      for (int i = 0; i < kBc / 2; ++i) {
        const int q_row = cwg * kWgRows + warp * 16 + g + 8 * ((i / 2) % 2), key = 8 * (i / 4) + 2 * quad + i % 2;
        float dot = 0.f;
#pragma unroll 1
        for (int c = 0; c < kD; c += 2) {
          const float2 a = unpack_pair(tile_element<kBr>(smem.q[0], q_row, c));
          const float2 b = unpack_pair(tile_element<kBc>(smem.k[stage][0], key, c));
          dot = fmaf(a.x, b.x, fmaf(a.y, b.y, dot));
        }
        fresh[i] = dot;
      }
      const bool mask = decltype(masked)::value && mask_last;
      if (mask && kMaskRolled) mask_s(row_tile, tile, AllKeys{}, std::false_type{}, fresh, std::true_type{});
#pragma unroll
      for (int i = 0; i < kBc / 2; ++i) s_acc[i] = fresh[i];
      if (mask && !kMaskRolled) mask_s(row_tile, tile, AllKeys{}, std::false_type{}, s_acc, std::false_type{});
    };
    // O rescaled by the factors of the last softmax (its columns are head dims, its rows the same
    // g, g + 8): once PV(j - 2) is complete, before the turn (V20).
    const auto rescale_o = [&] {
#pragma unroll
      for (int i = 0; i < kD / 2; ++i) o_acc[i] *= rescale[(i / 2) % 2];
    };
    // Once PV(j - 1) is done with P(j - 1): P(j) packed as wgmma A fragments, k16 slice kk (keys
    // 16kk..) from accumulator blocks 2kk, 2kk + 1.
    const auto pack_p = [&] {
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk)
#pragma unroll
        for (int r = 0; r < 4; ++r) p_frag[kk][r] = pack_pair<Element>(s_acc[8 * kk + 2 * r], s_acc[8 * kk + 2 * r + 1]);
    };
    // Done with this warpgroup's rows of this work tile's Q (after its last QK and the softmax that may
    // read them again): the producer may load the next work tile's rows of this warpgroup.
    const auto release_q = [&] {
      if (lane == 0) mbar_arrive(&smem.q_empty[cwg]);
    };

    Ring<kStages> ring;  // the next K/V tile to multiply, running over the work tiles
    uint32_t q_phase = 0;  // parity of the block's current work tile
    for (int round = 0; round < work.count; ++round) {
      const WorkTile t = work.tile_by_warp(round);
      const int tiles = key_tiles(t.row_tile, seq_len);
      const bool first_work_tile = round == 0, last_work_tile = round + 1 == work.count;
#pragma unroll
      for (int i = 0; i < kD / 2; ++i) o_acc[i] = 0.f;
      row_max[0] = row_max[1] = -INFINITY;
      row_sum[0] = row_sum[1] = 0.f;

      mbar_wait(&smem.q_full[cwg], q_phase);
      q_phase ^= 1;

      // ---- batch 0: QK(0), of 32 keys with kRaggedFirst --------------------------------------------
      using FirstKeys = std::conditional_t<kRaggedFirst, RaggedKeys, AllKeys>;
      constexpr int kFirstLive = FirstKeys::value / 2;  // the accumulators QK(0) writes
#pragma unroll
      for (int i = kFirstLive; i < kBc / 2; ++i) s_acc[i] = 0.f;  // P of the keys QK(0) leaves out
      mbar_wait(&smem.k_full[ring.stage], ring.phase);
      if (cwg != 0 || !first_work_tile) named_bar_sync(my_turn, kTurnThreads);  // A goes first, once
      batch_begin(FirstKeys{});
      issue_qk(ring.stage, FirstKeys{});
      wgmma_commit();
      named_bar_arrive(their_turn, kTurnThreads);
      wgmma_wait<0>();
      fence_regs(*reinterpret_cast<float(*)[kFirstLive]>(s_acc));
      // whether key tile 0 is one of the masked (a diagonal's, or the one S ends in)
      const bool first_masked = kMaskedTiles == 1 ? tiles == 1 : tiles <= kMaskedTiles;
      if (kRaggedFirst && !(kCausal && first_masked)) {  // key tile 0's keys r .. 31 are key tile 1's
#pragma unroll
        for (int i = 0; i < kFirstLive; ++i)
          if (8 * (i / 4) + 2 * quad + i % 2 >= seq_len % kBc) s_acc[i] = -INFINITY;
      } else if (kRaggedFirst || (mask_last && first_masked)) {  // a diagonal, or S, crosses it (with
        // kRaggedFirst: causal row tile 0, whose one key tile is both the part tile and its diagonal)
        mask_s(t.row_tile, 0, FirstKeys{}, std::true_type{}, s_acc, std::false_type{});
      }
      if (lane == 0) mbar_arrive(&smem.k_empty[ring.stage]);
      if (tiles == 1) release_q();
      softmax(FirstKeys{});

      // ---- batches 1 .. n - 1: QK(j), then PV(j - 1), two commit groups (V17's rotated loop) ------
      Ring<kStages> pv = ring;  // the stage of tile j - 1
      ring.advance();
      // One batch j of key tile `tile`; `masked` (std::integral_constant): whether the mask may apply, true
      // for the last kMaskedTiles key tiles only, where it applies if mask_last. The loop runs the tiles
      // before them from 1 with the mask compiled out, then those (all but key tile 0) with it.
      const auto batch = [&](int tile, auto masked) {
        constexpr bool kMasked = decltype(masked)::value;
        mbar_wait(&smem.k_full[ring.stage], ring.phase);
        mbar_wait(&smem.v_full[pv.stage], pv.phase);
        wgmma_wait<0>();  // PV(j - 2) complete (nothing pending at j = 1)
        fence_regs(o_acc);
#pragma unroll
        for (int kk = 0; kk < kBc / 16; ++kk) fence_regs(p_frag[kk]);
        if (tile > 1 && lane == 0) mbar_arrive(&smem.v_empty[pv.previous_stage()]);
        pack_p();     // P(j - 1)
        if (rescale_o_needed) rescale_o();  // by softmax(j - 1)'s factors, before the turn, if m moved
        named_bar_sync(my_turn, kTurnThreads);
        batch_begin(AllKeys{});  // one fence for both products: P and O were written by ordinary instructions
        issue_qk(ring.stage, AllKeys{});
        wgmma_commit();
        issue_pv(pv.stage);
        wgmma_commit();
        named_bar_arrive(their_turn, kTurnThreads);
        wgmma_wait<1>();  // QK(j) complete; PV(j - 1) may still run
        fence_regs(s_acc);
        if constexpr (kMasked) {
          if (mask_last) mask_s(t.row_tile, tile, AllKeys{}, std::false_type{}, s_acc, std::false_type{});
        }
        if (!softmax_against_m()) {  // overlaps PV(j - 1); rarely, S again and V22's softmax of it
          recompute_s(ring.stage, t.row_tile, tile, masked);
          softmax(AllKeys{});
        }
        if (lane == 0) mbar_arrive(&smem.k_empty[ring.stage]);  // K (and Q) read again at most above
        if (tile == tiles - 1) release_q();  // the last QK of this work tile has read Q
        pv = ring;
        ring.advance();
      };
      if constexpr (kMaskedTiles == 1) {  // the last tile peeled (a loop of one would change these builds' SASS)
        for (int tile = 1; tile < tiles - 1; ++tile) batch(tile, std::false_type{});
        if (tiles > 1) batch(tiles - 1, std::true_type{});
      } else {  // the diagonal's key tiles, each masked (but key tile 0, batch 0's), in a loop: one copy
        const int masked_from = max(1, tiles - kMaskedTiles);
        for (int tile = 1; tile < masked_from; ++tile) batch(tile, std::false_type{});
        for (int tile = masked_from; tile < tiles; ++tile) batch(tile, std::true_type{});
      }

      // ---- batch n: PV(n - 1) ---------------------------------------------------------------------
      mbar_wait(&smem.v_full[pv.stage], pv.phase);
      wgmma_wait<0>();  // PV(n - 2) complete (nothing pending if n = 1)
      fence_regs(o_acc);
#pragma unroll
      for (int kk = 0; kk < kBc / 16; ++kk) fence_regs(p_frag[kk]);
      if (tiles > 1 && lane == 0) mbar_arrive(&smem.v_empty[pv.previous_stage()]);
      pack_p();  // P(n - 1)
      // Epilogue step 1: the previous work tile's store has read the O tile (nothing to wait for at
      // the block's first); the turn sync below carries that to the warpgroup's 128 threads. (A shared
      // O tile's store thread waited for its store's read already, to tell the other consumer.)
      if (!kSharedOTile && store_thread()) bulk_wait_group_read<0>();
      if (rescale_o_needed) rescale_o();
      named_bar_sync(my_turn, kTurnThreads);
      batch_begin(AllKeys{});
      issue_pv(pv.stage);
      wgmma_commit();
      // the last consumer's very last: no one
      if (cwg != kConsumerWarpgroups - 1 || !last_work_tile) named_bar_arrive(their_turn, kTurnThreads);
      wgmma_wait<0>();
      fence_regs(o_acc);
      if (lane == 0) mbar_arrive(&smem.v_empty[pv.stage]);

      // ---- O / row_sum -> the O tile (fp16, stmatrix) -> global (TMA store, rows past S clipped);
      //      the producer is loading the next tile meanwhile ---------------------------------------
      float inv[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) inv[h] = 1.f / quad_sum(row_sum[h]);
      // A shared O tile: once the other consumer's last store has read it. A's first wait is on the phase
      // before the barrier's first, complete; after it A's and B's stores complete its phases in turn.
      if constexpr (kSharedOTile) mbar_wait(&smem.o_read, cwg ^ 1);
      const int o_tile_row = kSharedOTile ? 0 : cwg * kWgRows;  // this warpgroup's first row in the O tile
      write_o_rows<kORows>(smem.o[0], o_tile_row, o_acc, inv);
      fence_proxy_async();  // this thread's writes, visible to the TMA unit's reads
      named_bar_sync(kOBar + cwg, 128);  // all 128 threads of this warpgroup have written and fenced its rows
      if (kCausal && kRaggedFirst && t.row_tile == 0) {  // rows before 0: the warpgroup copies its rows >= 0
        Element* o_head = o + (size_t(t.batch) * heads + t.head) * size_t(seq_len) * kD;
        for (int c = threadIdx.x % 128; c < kWgRows * (kD / 8); c += 128) {
          const int wg_row = c / (kD / 8), col = 8 * (c % (kD / 8)), row = cwg * kWgRows + wg_row - row_shift;
          if (row >= 0 && (kBr == kBc || row < seq_len))  // (at Br = Bc every row of row tile 0 is before S)
            *reinterpret_cast<uint4*>(o_head + size_t(row) * kD + col) =
                *reinterpret_cast<const uint4*>(tile_element<kORows>(smem.o[0], o_tile_row + wg_row, col));
        }
        if constexpr (kSharedOTile) {  // the other consumer may write the O tile once all 128 have read it
          named_bar_sync(kOBar + cwg, 128);
          if (store_thread()) mbar_arrive(&smem.o_read);
        }
      } else if (store_thread()) {  // one thread stores the 64 rows: head columns 0-63 from box 0, 64-127 from box 1 ..
        const int o_row = t.row_tile * kBr + cwg * kWgRows - row_shift;
        // (box by box: as a loop over them, ptxas placed the store's set-up otherwise)
        tma_store_4d(&tmap_o, smem.o[0] + o_tile_row * kBoxCols, 0, o_row, t.head, t.batch);
        if constexpr (kBoxes >= 2) tma_store_4d(&tmap_o, smem.o[1] + o_tile_row * kBoxCols, kBoxCols, o_row, t.head, t.batch);
        if constexpr (kBoxes == 4) {
          tma_store_4d(&tmap_o, smem.o[2] + o_tile_row * kBoxCols, 2 * kBoxCols, o_row, t.head, t.batch);
          tma_store_4d(&tmap_o, smem.o[3] + o_tile_row * kBoxCols, 3 * kBoxCols, o_row, t.head, t.batch);
        }
        bulk_commit_group();
        if constexpr (kSharedOTile) {  // the other consumer may write the O tile once this store has read it
          bulk_wait_group_read<0>();
          mbar_arrive(&smem.o_read);
        }
      }
    }
    // The block's last stores must have read the O tile before the block exits and its shared
    // memory goes to another; waiting for the whole group is as cheap and leaves nothing in flight.
    if (store_thread()) bulk_wait_group<0>();
  }
}

#define FLASH_V25_PARAMS                                                                                       \
  const Element* __restrict__ q, const Element* __restrict__ k, const Element* __restrict__ v,                 \
      Element* __restrict__ o, int seq_len, float scale_log2, const __grid_constant__ CUtensorMap tmap_q,      \
      const __grid_constant__ CUtensorMap tmap_k, const __grid_constant__ CUtensorMap tmap_v,                  \
      const __grid_constant__ CUtensorMap tmap_o, int row_tiles, int batch_heads, int heads, int kv_group,     \
      const int4* __restrict__ work_list
// Every S but those the next entry takes.
extern "C" __global__ void __launch_bounds__(kThreads, kCtasPerSm) flash_attention_forward(FLASH_V25_PARAMS) {
  attention<false>(seq_len, scale_log2, tmap_q, tmap_k, tmap_v, tmap_o, row_tiles, batch_heads, heads, kv_group,
                   work_list, o);
}
// S whose last key tile holds 1 to 32 keys (0 < S mod Bc <= kRaggedFirstKeys): the key tiles (and under
// the mask the row tiles) laid out from S's end. At another S it would drop keys or mask whole tiles;
// the launcher alone holds it to its S (a trap on the S here, in each place tried, had ptxas serialise
// every wgmma of the entry, C7511).
extern "C" __global__ void __launch_bounds__(kThreads, kCtasPerSm)
flash_attention_forward_ragged_first(FLASH_V25_PARAMS) {
  attention<true>(seq_len, scale_log2, tmap_q, tmap_k, tmap_v, tmap_o, row_tiles, batch_heads, heads, kv_group,
                  work_list, o);
}
#undef FLASH_V25_PARAMS
