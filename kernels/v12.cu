// V12: fragment reshape (chapter G3, first step). 219.15 TFLOPS on B300 in the write-up, +52%
// over V11, the biggest single step of the series. Rebuilt from the write-up's description.
//
//   8 warps, Br = 64 query rows per block, Bc = 64 keys per KV tile, D = 128, grid (S/64, B*H).
//   QK: warps 0-3 each own 16 whole rows and all 64 keys of the tile (WarpN = 64), so a row's
//   max and sum are reduced inside one warp (two quad shuffles) and the logits never leave the
//   registers. Warps 4-7 wait during QK: the price of the reshape.
//
//              keys 0..63                      head cols 0..63   64..127
//   rows  0-15   warp 0          PV:   rows  0-15   warp 0        warp 4
//   rows 16-31   warp 1                rows 16-31   warp 1        warp 5
//   rows 32-47   warp 2                rows 32-47   warp 2        warp 6
//   rows 48-63   warp 3                rows 48-63   warp 3        warp 7
//
//   Per KV tile: QK mma (warps 0-3) | sync: K no longer read, cp.async V -> smem_kv (same buffer
//   as K) | online softmax in registers, exp(P) written once as fp16 to smem_p, the rescale
//   factor to smem_row_rescale (warps 0-3) | sync | PV mma on all 8 warps, O in registers | sync
//   | cp.async the next K -> smem_kv | sync.
//
// Choice: the sync that V11 needed between the logits and the softmax is gone; the one that takes
// its place (after QK) only guards the K -> V reuse of smem_kv, and lets the V load overlap the
// softmax, as in V11. The row sum is reduced across the quad every tile, as the row max is (the
// description puts both reductions inside the warp). exp(P) goes to smem_p with stmatrix (the
// accumulator layout is exactly stmatrix's), in natural key order, 128-byte swizzled. No
// minimum-blocks hint in __launch_bounds__: the cap of 128 registers comes with V13. Offsets and
// swizzled addresses are recomputed each tile (opaque, see flash_common.cuh): held in registers
// through the loop they took this kernel to 159 registers, one block per SM, on sm_90.
//
#include "flash_common.cuh"

using namespace flash;

namespace {

constexpr int kThreads = 256;
constexpr int kQkWarps = 4;            // warps 0-3 run QK and the softmax
constexpr int kBr = 64;                // query rows per block: 16 per QK warp
constexpr int kBc = 64;                // keys per KV tile
constexpr int kD = kHeadDim;
constexpr int kPChunks = kBc / kChunkHalves;  // 8 chunks in a P row of 128 bytes

struct SharedStorage {
  half q[kBr * kD];                    // 16 KB, swizzled
  half kv[kBc * kD];                   // 16 KB, K then V of the same tile, swizzled
  half p[kBr * kBc];                   //  8 KB, swizzled
  float row_rescale[kBr];              // exp2((old max - new max) * scale) of this tile
  float row_sum[kBr];                  // written once, after the last tile
};

static_assert(offsetof(SharedStorage, q) % 256 == 0 && offsetof(SharedStorage, kv) % 256 == 0 &&
                  offsetof(SharedStorage, p) % 128 == 0,
              "kstep_addr needs tiles on row-size boundaries");

}  // namespace

FLASH_LAUNCH_CONTRACT(kThreads, kBr, kBc, 0)

extern "C" __global__ void __launch_bounds__(kThreads)
flash_attention_forward(const half* __restrict__ q, const half* __restrict__ k, const half* __restrict__ v,
                        half* __restrict__ o, int seq_len, float scale_log2) {
  __shared__ __align__(1024) SharedStorage smem;  // tile rows 256-byte aligned: see kstep_addr

  const int thread = threadIdx.x, warp = thread / 32, lane = thread % 32;
  const int g = lane / 4, quad = lane % 4;  // accumulator row / column pair of this lane
  const bool qk_warp = warp < kQkWarps;
  // Offsets into [B*H, S, D]: tile `tile` of this head's K or V, and this block's rows of Q and O.
  // They are recomputed where used (opaque), so no pointer is held in registers through the loop.
  const auto kv_tile_offset = [&](int tile) { return (size_t(opaque(blockIdx.y)) * seq_len + size_t(tile) * kBc) * kD; };
  const auto block_offset = [&] { return (size_t(opaque(blockIdx.y)) * seq_len + size_t(blockIdx.x) * kBr) * kD; };

  const int qk_rows = warp * 16;               // QK (warps 0-3): 16 query rows, all 64 keys
  const int pv_rows = (warp % 4) * 16;         // PV: 16 query rows
  const int pv_chunk0 = (warp / 4) * 8;        //     and 64 head columns (8 chunks)

  // ---- prologue: Q and the first K tile -------------------------------------------------------
  load_tile_async<kBr, kThreads>(smem.q, q + block_offset(), thread);
  load_tile_async<kBc, kThreads>(smem.kv, k + kv_tile_offset(0), thread);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  // Q fragments stay in the QK warps' registers for the whole block: 8 k-steps of 16 columns.
  uint32_t q_frag[kD / 16][4];
  if (qk_warp) {
#pragma unroll
    for (int ks = 0; ks < kD / 16; ++ks)
      ldmatrix_x4(q_frag[ks], smem_addr(smem.q + swizzle<kRowChunks>(qk_rows + lane % 16, 2 * ks + lane / 16)));
  }
  // Row statistics of rows g and g + 8 of this QK warp, the same in the 4 lanes of a quad.
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.f, 0.f};

  float o_acc[8][4] = {};  // 16 rows x 64 head columns per warp
  // ldmatrix / stmatrix addresses of k-step 0; later k-steps are one XOR away (kstep_addr).
  const uint32_t k_addr0 = smem_addr(smem.kv + swizzle<kRowChunks>((lane / 16) * 8 + lane % 8, (lane / 8) % 2));
  const uint32_t p_store_addr0 = smem_addr(smem.p + swizzle<kPChunks>(qk_rows + (lane / 8) % 2 * 8 + lane % 8, lane / 16));
  const uint32_t p_addr0 = smem_addr(smem.p + swizzle<kPChunks>(pv_rows + lane % 16, lane / 16));
  const uint32_t v_addr0 = smem_addr(smem.kv + swizzle<kRowChunks>(((lane / 8) % 2) * 8 + lane % 8, pv_chunk0 + lane / 16));
  const int num_tiles = seq_len / kBc;

  for (int tile = 0; tile < num_tiles; ++tile) {
    const uint32_t k_addr = opaque(k_addr0), p_store_addr = opaque(p_store_addr0), p_addr = opaque(p_addr0),
                   v_addr = opaque(v_addr0);
    // ---- S = Q K^T for this QK warp's 16 rows x 64 keys -------------------------------------------
    float s_acc[8][4] = {};
    if (qk_warp) {
#pragma unroll
      for (int ks = 0; ks < kD / 16; ++ks) {
#pragma unroll
        for (int np = 0; np < 4; ++np) {  // two n8 tiles (keys 16np..) per ldmatrix.x4
          uint32_t b[4];
          ldmatrix_x4(b, kstep_addr(k_addr, ks) + np * 16 * kD * sizeof(half));
          mma_m16n8k16(s_acc[2 * np], q_frag[ks], b[0], b[1]);
          mma_m16n8k16(s_acc[2 * np + 1], q_frag[ks], b[2], b[3]);
        }
      }
    }
    __syncthreads();  // K no longer read: V can take its buffer, and load during the softmax

    load_tile_async<kBc, kThreads>(smem.kv, v + kv_tile_offset(tile), thread);
    cp_async_commit();

    // ---- online softmax in registers: lane holds rows g (d0, d1) and g + 8 (d2, d3) --------------
    if (qk_warp) {
      float new_max[2], rescale[2], tile_sum[2] = {0.f, 0.f};
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // rows g, g + 8
        float tile_max = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < 8; ++nt) tile_max = fmaxf(tile_max, fmaxf(s_acc[nt][2 * h], s_acc[nt][2 * h + 1]));
        new_max[h] = fmaxf(row_max[h], quad_max(tile_max));
        rescale[h] = fast_exp2((row_max[h] - new_max[h]) * scale_log2);
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
        stmatrix_x4(kstep_addr(p_store_addr, j), pack_half2(s_acc[2 * j][0], s_acc[2 * j][1]),
                    pack_half2(s_acc[2 * j][2], s_acc[2 * j][3]), pack_half2(s_acc[2 * j + 1][0], s_acc[2 * j + 1][1]),
                    pack_half2(s_acc[2 * j + 1][2], s_acc[2 * j + 1][3]));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        row_max[h] = new_max[h];
        row_sum[h] = row_sum[h] * rescale[h] + quad_sum(tile_sum[h]);
        if (quad == 0) smem.row_rescale[qk_rows + g + 8 * h] = rescale[h];
      }
    }
    cp_async_wait<0>();
    __syncthreads();  // V landed; P and row_rescale complete

    // ---- O = O * rescale + P V: warp owns 16 rows x 64 head columns -------------------------
    const float rescale_lo = smem.row_rescale[pv_rows + g], rescale_hi = smem.row_rescale[pv_rows + g + 8];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) {
      o_acc[nt][0] *= rescale_lo;
      o_acc[nt][1] *= rescale_lo;
      o_acc[nt][2] *= rescale_hi;
      o_acc[nt][3] *= rescale_hi;
    }
#pragma unroll
    for (int ks = 0; ks < kBc / 16; ++ks) {
      uint32_t p_frag[4];
      ldmatrix_x4(p_frag, kstep_addr(p_addr, ks));
#pragma unroll
      for (int np = 0; np < 4; ++np) {  // V^T fragments: keys 16ks.., head chunks 2np..
        uint32_t b[4];
        ldmatrix_x4_trans(b, kstep_addr(v_addr, np) + ks * 16 * kD * sizeof(half));
        mma_m16n8k16(o_acc[2 * np], p_frag, b[0], b[1]);
        mma_m16n8k16(o_acc[2 * np + 1], p_frag, b[2], b[3]);
      }
    }
    __syncthreads();  // V and P no longer read

    if (tile + 1 < num_tiles) {  // the next K tile goes into the same buffer
      load_tile_async<kBc, kThreads>(smem.kv, k + kv_tile_offset(tile + 1), thread);
      cp_async_commit();
      cp_async_wait<0>();
      __syncthreads();
    }
  }

  // ---- O / row_sum -> global, fp16 ---------------------------------------------------------------
  o += block_offset();
  if (qk_warp && quad == 0) {
    smem.row_sum[qk_rows + g] = row_sum[0];
    smem.row_sum[qk_rows + g + 8] = row_sum[1];
  }
  __syncthreads();
  const float inv_lo = 1.f / smem.row_sum[pv_rows + g], inv_hi = 1.f / smem.row_sum[pv_rows + g + 8];
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
    const int column = pv_chunk0 * kChunkHalves + nt * 8 + 2 * quad;
    *reinterpret_cast<uint32_t*>(o + (pv_rows + g) * kD + column) = pack_half2(o_acc[nt][0] * inv_lo, o_acc[nt][1] * inv_lo);
    *reinterpret_cast<uint32_t*>(o + (pv_rows + g + 8) * kD + column) =
        pack_half2(o_acc[nt][2] * inv_hi, o_acc[nt][3] * inv_hi);
  }
  require_grid_covers(seq_len, kBr, kBc);  // last: placed first, it cost V12 32 registers (160)
}
