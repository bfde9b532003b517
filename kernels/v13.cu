// V13: warp specialisation and an asynchronous V load (chapter G3, second step). 226.83 TFLOPS on
// B300 in the write-up, +3.5% over V12. Rebuilt from the write-up's description.
//
//   8 warps, Br = 64 query rows per block (BLOCK_ROWS), Bc = 64, D = 128, grid (S/Br, B*H).
//   V12 left warps 4-7 idle during QK, and V could only load once QK had freed the shared
//   smem_kv. V13 gives V its own buffer and those warps the job of filling it:
//
//   warps 0-3 | QK mma + softmax, exp(P) -> smem_p |      | PV (its rows, head cols 0-63)   |
//   warps 4-7 | cp.async V(tile) -> smem_v, wait   | sync | cp.async K(tile+1) -> smem_k,   | sync
//             |                                    |      | PV (its rows, head cols 64-127) |
//
//   Shared memory: Q 16 KB + K 16 KB + V 16 KB + P 8 KB + row statistics = 56.5 KiB, above the
//   48 KB static limit: dynamic shared memory with the opt-in (the launcher sets
//   cudaFuncAttributeMaxDynamicSharedMemorySize). __launch_bounds__(256, 2): two blocks per SM,
//   so ptxas holds each thread to 65536 / (256 * 2) = 128 registers.
//
// The chapter's two ablations are compile-time parameters of this file:
//   -DBLOCK_ROWS=128                  Br = 128: each QK warp owns 32 rows (two m16 tiles, one
//                                     after the other), each PV warp 32 rows x 64 head columns.
//                                     Under the same 128-register cap the Q fragments (64
//                                     registers), O (64) and the logits (32) do not fit: spills.
//   -DBLOCK_ROWS=128 -DHYBRID_SMEM=1  the hybrid: Br = 128 with two pieces of per-warp state
//                                     moved from registers to shared memory: the Q fragments
//                                     stay in smem_q and are read with ldmatrix at each k-step
//                                     of QK, and the running row max and sum live in
//                                     smem.row_max / smem.row_sum. O and the logits stay in
//                                     registers.
//
// Choice: the loader warps also issue the next K tile, as soon as the sync after QK has freed its
// buffer, so it lands during PV: with separate K and V buffers that costs nothing and leaves two
// syncs per tile (V12 has four). The hybrid moves Q and the row statistics rather than part of O:
// O is updated by every PV mma, Q is read-only and already resident in smem_q. It also keeps its
// QK k-step loop rolled, so that one k-step's K fragments are live at a time; unrolled, ptxas
// spills 32-64 bytes even with Q and the statistics out of the registers (V13's Q fragments
// need the unrolled loop: indexed by a runtime k-step they would go to local memory). Offsets and
// swizzled addresses are recomputed each tile (opaque), not held in registers.
//
#include "flash_common.cuh"

#ifndef BLOCK_ROWS
#define BLOCK_ROWS 64
#endif
#ifndef HYBRID_SMEM
#define HYBRID_SMEM 0
#endif

using namespace flash;

namespace {

constexpr int kThreads = 256;
constexpr int kQkWarps = 4;                  // warps 0-3: QK and softmax; warps 4-7: the loads
constexpr int kLoaderThreads = kThreads - kQkWarps * 32;
constexpr int kBr = BLOCK_ROWS;              // query rows per block
constexpr int kBc = 64;                      // keys per KV tile
constexpr int kD = kHeadDim;
constexpr int kWarpRows = kBr / kQkWarps;    // rows per QK warp, and per PV warp
constexpr int kMTiles = kWarpRows / 16;      // m16 tiles per warp: 1 (Br = 64) or 2 (Br = 128)
constexpr int kPChunks = kBc / kChunkHalves; // 8 chunks in a P row of 128 bytes
constexpr bool kHybridSmem = HYBRID_SMEM;
static_assert(kBr == 64 || kBr == 128, "BLOCK_ROWS must be 64 or 128");

struct SharedStorage {
  half q[kBr * kD];                    // 16 KB (32 KB at Br = 128), swizzled
  half k[kBc * kD];                    // 16 KB, swizzled
  half v[kBc * kD];                    // 16 KB, swizzled
  half p[kBr * kBc];                   //  8 KB (16 KB), swizzled
  float row_rescale[kBr];              // exp2((old max - new max) * scale) of this tile
  float row_sum[kBr];                  // after the last tile (the hybrid: running, every tile)
  float row_max[kHybridSmem ? kBr : 1];  // the hybrid only: running max
};

static_assert(offsetof(SharedStorage, q) % 256 == 0 && offsetof(SharedStorage, k) % 256 == 0 &&
                  offsetof(SharedStorage, v) % 256 == 0 && offsetof(SharedStorage, p) % 128 == 0,
              "kstep_addr needs tiles on row-size boundaries");

}  // namespace

FLASH_LAUNCH_CONTRACT(kThreads, kBr, kBc, sizeof(SharedStorage))

extern "C" __global__ void __launch_bounds__(kThreads, 2)
flash_attention_forward(const half* __restrict__ q, const half* __restrict__ k, const half* __restrict__ v,
                        half* __restrict__ o, int seq_len, float scale_log2) {
  extern __shared__ __align__(1024) unsigned char smem_bytes[];
  SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_bytes);

  const int thread = threadIdx.x, warp = thread / 32, lane = thread % 32;
  const int g = lane / 4, quad = lane % 4;  // accumulator row / column pair of this lane
  const bool qk_warp = warp < kQkWarps;
  // Offsets into [B*H, S, D]: tile `tile` of this head's K or V, and this block's rows of Q and O.
  // They are recomputed where used (opaque), so no pointer is held in registers through the loop.
  const auto kv_tile_offset = [&](int tile) { return (size_t(opaque(blockIdx.y)) * seq_len + size_t(tile) * kBc) * kD; };
  const auto block_offset = [&] { return (size_t(opaque(blockIdx.y)) * seq_len + size_t(blockIdx.x) * kBr) * kD; };

  const int qk_rows = warp * kWarpRows;        // QK (warps 0-3): kWarpRows query rows, all 64 keys
  const int pv_rows = (warp % 4) * kWarpRows;  // PV: kWarpRows query rows
  const int pv_chunk0 = (warp / 4) * 8;        //     and 64 head columns (8 chunks)

  // ---- prologue: Q and the first K tile -------------------------------------------------------
  load_tile_async<kBr, kThreads>(smem.q, q + block_offset(), thread);
  load_tile_async<kBc, kThreads>(smem.k, k + kv_tile_offset(0), thread);
  cp_async_commit();
  if (kHybridSmem && thread < kBr) smem.row_max[thread] = -INFINITY, smem.row_sum[thread] = 0.f;
  cp_async_wait<0>();
  __syncthreads();

  // Q fragments of m-tile mt, k-step ks: held in registers for the whole block, or (the hybrid)
  // read from smem_q when needed.
  const uint32_t q_addr0 = smem_addr(smem.q + swizzle<kRowChunks>(qk_rows + lane % 16, lane / 16));
  uint32_t q_frag[kMTiles][kD / 16][4];  // never touched, so never allocated, in the hybrid
  if (!kHybridSmem && qk_warp) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
      for (int ks = 0; ks < kD / 16; ++ks) ldmatrix_x4(q_frag[mt][ks], kstep_addr(q_addr0, ks) + mt * 16 * kD * sizeof(half));
  }
  // Row statistics of rows g and g + 8 of each m-tile of this QK warp, the same in a quad.
  // (The hybrid keeps them in smem.row_max / smem.row_sum instead.)
  float row_max[kMTiles][2], row_sum[kMTiles][2];
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt)
    for (int h = 0; h < 2; ++h) row_max[mt][h] = -INFINITY, row_sum[mt][h] = 0.f;

  float o_acc[kMTiles][8][4] = {};  // kWarpRows rows x 64 head columns per warp
  // ldmatrix addresses of k-step 0; later k-steps are one XOR away (kstep_addr).
  const uint32_t k_addr0 = smem_addr(smem.k + swizzle<kRowChunks>((lane / 16) * 8 + lane % 8, (lane / 8) % 2));
  const uint32_t p_store_addr0 = smem_addr(smem.p + swizzle<kPChunks>(qk_rows + (lane / 8) % 2 * 8 + lane % 8, lane / 16));
  const uint32_t p_addr0 = smem_addr(smem.p + swizzle<kPChunks>(pv_rows + lane % 16, lane / 16));
  const uint32_t v_addr0 = smem_addr(smem.v + swizzle<kRowChunks>(((lane / 8) % 2) * 8 + lane % 8, pv_chunk0 + lane / 16));
  const int num_tiles = seq_len / kBc;

  for (int tile = 0; tile < num_tiles; ++tile) {
    const uint32_t p_addr = opaque(p_addr0), v_addr = opaque(v_addr0);
    if (qk_warp) {
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt) {
        // ---- S = Q K^T for 16 rows x 64 keys -----------------------------------------------------
        const uint32_t q_addr = opaque(q_addr0), k_addr = opaque(k_addr0), p_store_addr = opaque(p_store_addr0);
        float s_acc[8][4] = {};
#pragma unroll(kHybridSmem ? 1 : kD / 16)
        for (int ks = 0; ks < kD / 16; ++ks) {
          uint32_t a[4];
          if constexpr (kHybridSmem) {
            ldmatrix_x4(a, kstep_addr(q_addr, ks) + mt * 16 * kD * sizeof(half));
          } else {
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = q_frag[mt][ks][i];
          }
#pragma unroll
          for (int np = 0; np < 4; ++np) {  // two n8 tiles (keys 16np..) per ldmatrix.x4
            uint32_t b[4];
            ldmatrix_x4(b, kstep_addr(k_addr, ks) + np * 16 * kD * sizeof(half));
            mma_m16n8k16(s_acc[2 * np], a, b[0], b[1]);
            mma_m16n8k16(s_acc[2 * np + 1], a, b[2], b[3]);
          }
        }
        // ---- online softmax in registers: lane holds rows g (d0, d1) and g + 8 (d2, d3) ----------
        float old_max[2], new_max[2], rescale[2], tile_sum[2] = {0.f, 0.f};
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // rows g, g + 8
          old_max[h] = kHybridSmem ? smem.row_max[qk_rows + 16 * mt + g + 8 * h] : row_max[mt][h];
          float tile_max = -INFINITY;
#pragma unroll
          for (int nt = 0; nt < 8; ++nt) tile_max = fmaxf(tile_max, fmaxf(s_acc[nt][2 * h], s_acc[nt][2 * h + 1]));
          new_max[h] = fmaxf(old_max[h], quad_max(tile_max));
          rescale[h] = fast_exp2((old_max[h] - new_max[h]) * scale_log2);
        }
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {  // e / 2: row g or g + 8
            s_acc[nt][e] = fast_exp2(fmaf(s_acc[nt][e], scale_log2, -new_max[e / 2] * scale_log2));
            tile_sum[e / 2] += s_acc[nt][e];
          }
        // exp(P) -> smem_p as fp16, one stmatrix.x4 per pair of n8 tiles (matrix i = rows 8(i%2)..,
        // keys 8(2j + i/2)..); chunk 2j is chunk 0 XOR 32j bytes, as for the k-steps.
#pragma unroll
        for (int j = 0; j < 4; ++j)
          stmatrix_x4(kstep_addr(p_store_addr, j) + mt * 16 * kBc * sizeof(half),
                      pack_half2(s_acc[2 * j][0], s_acc[2 * j][1]), pack_half2(s_acc[2 * j][2], s_acc[2 * j][3]),
                      pack_half2(s_acc[2 * j + 1][0], s_acc[2 * j + 1][1]),
                      pack_half2(s_acc[2 * j + 1][2], s_acc[2 * j + 1][3]));
        if (kHybridSmem) __syncwarp();  // the quad has read the old max before lane 0 replaces it
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = qk_rows + 16 * mt + g + 8 * h;
          const float row_tile_sum = quad_sum(tile_sum[h]);
          if constexpr (kHybridSmem) {
            if (quad == 0) {
              smem.row_max[row] = new_max[h];
              smem.row_sum[row] = smem.row_sum[row] * rescale[h] + row_tile_sum;
            }
          } else {
            row_max[mt][h] = new_max[h];
            row_sum[mt][h] = row_sum[mt][h] * rescale[h] + row_tile_sum;
          }
          if (quad == 0) smem.row_rescale[row] = rescale[h];
        }
      }
    } else {  // ---- warps 4-7: V of this tile, while QK runs ---------------------------------------
      load_tile_async<kBc, kLoaderThreads>(smem.v, v + kv_tile_offset(tile), thread - kQkWarps * 32);
      cp_async_commit();
      cp_async_wait<0>();
    }
    __syncthreads();  // P and row_rescale complete, V landed, K no longer read

    if (!qk_warp && tile + 1 < num_tiles) {  // K's buffer is free: the next tile lands during PV
      load_tile_async<kBc, kLoaderThreads>(smem.k, k + kv_tile_offset(tile + 1), thread - kQkWarps * 32);
      cp_async_commit();
    }

    // ---- O = O * rescale + P V: warp owns kWarpRows rows x 64 head columns ----------------------
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      const float rescale_lo = smem.row_rescale[pv_rows + 16 * mt + g];
      const float rescale_hi = smem.row_rescale[pv_rows + 16 * mt + g + 8];
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        o_acc[mt][nt][0] *= rescale_lo;
        o_acc[mt][nt][1] *= rescale_lo;
        o_acc[mt][nt][2] *= rescale_hi;
        o_acc[mt][nt][3] *= rescale_hi;
      }
    }
#pragma unroll
    for (int ks = 0; ks < kBc / 16; ++ks) {
      uint32_t p_frag[kMTiles][4];
#pragma unroll
      for (int mt = 0; mt < kMTiles; ++mt)
        ldmatrix_x4(p_frag[mt], kstep_addr(p_addr, ks) + mt * 16 * kBc * sizeof(half));
#pragma unroll
      for (int np = 0; np < 4; ++np) {  // V^T fragments: keys 16ks.., head chunks 2np..
        uint32_t b[4];
        ldmatrix_x4_trans(b, kstep_addr(v_addr, np) + ks * 16 * kD * sizeof(half));
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
          mma_m16n8k16(o_acc[mt][2 * np], p_frag[mt], b[0], b[1]);
          mma_m16n8k16(o_acc[mt][2 * np + 1], p_frag[mt], b[2], b[3]);
        }
      }
    }
    cp_async_wait<0>();
    __syncthreads();  // the next K landed; V, P and row_rescale no longer read
  }

  // ---- O / row_sum -> global, fp16 ---------------------------------------------------------------
  o += block_offset();
  if (!kHybridSmem && qk_warp && quad == 0) {
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
      smem.row_sum[qk_rows + 16 * mt + g] = row_sum[mt][0];
      smem.row_sum[qk_rows + 16 * mt + g + 8] = row_sum[mt][1];
    }
  }
  __syncthreads();
#pragma unroll
  for (int mt = 0; mt < kMTiles; ++mt) {
    const int row_lo = pv_rows + 16 * mt + g, row_hi = row_lo + 8;
    const float inv_lo = 1.f / smem.row_sum[row_lo], inv_hi = 1.f / smem.row_sum[row_hi];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      const int column = pv_chunk0 * kChunkHalves + nt * 8 + 2 * quad;
      *reinterpret_cast<uint32_t*>(o + row_lo * kD + column) = pack_half2(o_acc[mt][nt][0] * inv_lo, o_acc[mt][nt][1] * inv_lo);
      *reinterpret_cast<uint32_t*>(o + row_hi * kD + column) = pack_half2(o_acc[mt][nt][2] * inv_hi, o_acc[mt][nt][3] * inv_hi);
    }
  }
  require_grid_covers(seq_len, kBr, kBc);  // last: placed first, it cost V12 32 registers (160)
  if (smem_addr(smem_bytes) % 1024 != 0) __trap();  // the swizzled tiles need a 1024-aligned base
}
