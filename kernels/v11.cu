// V11: the end state of G2, where chapter G3 starts (rebuilt from the write-up's description;
// no source of the write-up exists). 144.41 TFLOPS on B300 in the write-up.
//
//   4 warps, Br = 32 query rows per block, Bc = 64 keys per KV tile, D = 128, grid (S/32, B*H).
//   QK warp layout 2 x 2: a row of logits is split over two warps, so it must go through shared
//   memory before the softmax can see the whole row:
//
//              keys 0..31   keys 32..63
//   rows  0-15   warp 0       warp 1
//   rows 16-31   warp 2       warp 3
//
//   Per KV tile: cp.async K -> smem_kv | QK mma -> fp32 logits -> smem_logits (stmatrix)
//   | cp.async V -> smem_kv (same buffer) | online softmax from smem_logits, 4 rows per warp at a
//   time, each lane two adjacent columns (vec2), exp2 with the scale folded into one FMA; lane 0
//   keeps the row statistics and shares the rescale factor via smem_row_rescale | fp16 P ->
//   smem_p | PV mma: warp w owns rows 16*(w/2).. and head columns 64*(w%2).., O in registers.
//
// Choice: stmatrix moves 16-bit elements, so the fp32
// logits are stored as 32-bit payloads. For each 16x8 accumulator tile the even columns land in
// the first four floats of each 8-float group and the odd ones in the last four (see
// logits_column_to_key). Softmax does not care about column order; P keeps the stored order, and
// PV reads the V row of the matching key, so nothing is shuffled. The logits rows are padded to
// 68 floats (64 + one 16-byte access width): with stmatrix's 16-byte rows that puts 8 rows on 8
// different bank quads (the write-up's pad of 72 would leave a 2-way conflict for this access).
// Q, K and V tiles use the 128-byte swizzle and the XOR address walk of flash_common.cuh. No
// minimum-blocks hint in __launch_bounds__: the write-up reports about 96 registers and 5 blocks
// per SM; this rebuild needs more (see the resource table) and spills when held to 5 blocks.
//
#include "flash_common.cuh"

using namespace flash;

namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kBr = 32;                 // query rows per block
constexpr int kBc = 64;                 // keys per KV tile
constexpr int kD = kHeadDim;
constexpr int kLogitsStride = kBc + 4;  // floats per smem_logits row
constexpr int kRowsPerSoftmaxPass = 4;  // the "4-row softmax": four independent rows in flight

struct SharedStorage {
  half q[kBr * kD];                     //  8 KB, swizzled
  half kv[kBc * kD];                    // 16 KB, K then V of the same tile, swizzled
  half p[kBr * kBc];                    //  4 KB, swizzled, keys in logits order
  float logits[kBr * kLogitsStride];    //  8.5 KB
  float row_max[kBr];                   // running max of the raw (unscaled) logits
  float row_sum[kBr];                   // running sum of exp
  float row_rescale[kBr];               // exp2((old max - new max) * scale), set by lane 0
};

static_assert(offsetof(SharedStorage, q) % 256 == 0 && offsetof(SharedStorage, kv) % 256 == 0 &&
                  offsetof(SharedStorage, p) % 128 == 0,
              "kstep_addr needs tiles on row-size boundaries");

// Column c of a logits / P row holds key logits_column_to_key(c) of the tile:
//   stored column: 0  1  2  3  4  5  6  7 | 8 ...
//   key:           0  2  4  6  1  3  5  7 | 8 ...
__device__ __forceinline__ int logits_column_to_key(int column) {
  const int group = column & ~7, within = column & 7;
  return group + ((within & 3) << 1) + (within >> 2);
}

}  // namespace

FLASH_LAUNCH_CONTRACT(kThreads, kBr, kBc, 0)

extern "C" __global__ void __launch_bounds__(kThreads)
flash_attention_forward(const half* __restrict__ q, const half* __restrict__ k, const half* __restrict__ v,
                        half* __restrict__ o, int seq_len, float scale_log2) {
  __shared__ __align__(1024) SharedStorage smem;  // tile rows 256-byte aligned: see kstep_addr

  const int thread = threadIdx.x, warp = thread / 32, lane = thread % 32;
  const int g = lane / 4, quad = lane % 4;  // accumulator row / column pair of this lane
  const size_t head_offset = size_t(blockIdx.y) * seq_len * kD;
  const int q_row0 = blockIdx.x * kBr;
  q += head_offset + size_t(q_row0) * kD;
  k += head_offset;
  v += head_offset;
  o += head_offset + size_t(q_row0) * kD;

  const int qk_rows = (warp / 2) * 16;    // QK: this warp's 16 query rows
  const int qk_keys = (warp % 2) * 32;    //     and its 32 keys of the tile
  const int pv_rows = (warp / 2) * 16;    // PV: this warp's 16 query rows
  const int pv_chunk0 = (warp % 2) * 8;   //     and its 64 head columns (8 chunks)

  // ---- prologue: Q and the first K tile -------------------------------------------------------
  load_tile_async<kBr, kThreads>(smem.q, q, thread);
  load_tile_async<kBc, kThreads>(smem.kv, k, thread);
  cp_async_commit();
  if (thread < kBr) {
    smem.row_max[thread] = -INFINITY;
    smem.row_sum[thread] = 0.f;
  }
  cp_async_wait<0>();
  __syncthreads();

  // Q fragments stay in registers for the whole block: 8 k-steps of 16 head columns.
  uint32_t q_frag[kD / 16][4];
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks)
    ldmatrix_x4(q_frag[ks], smem_addr(smem.q + swizzle<kRowChunks>(qk_rows + lane % 16, 2 * ks + lane / 16)));

  float o_acc[8][4] = {};  // 16 rows x 64 head columns per warp
  // ldmatrix addresses of k-step 0; later k-steps are one XOR away (kstep_addr).
  const uint32_t k_addr0 = smem_addr(smem.kv + swizzle<kRowChunks>(qk_keys + (lane / 16) * 8 + lane % 8, (lane / 8) % 2));
  const uint32_t p_addr0 = smem_addr(smem.p + swizzle<kBc / kChunkHalves>(pv_rows + lane % 16, lane / 16));
  const uint32_t v_addr0 =
      smem_addr(smem.kv + swizzle<kRowChunks>(logits_column_to_key(((lane / 8) % 2) * 8 + lane % 8), pv_chunk0 + lane / 16));
  const int num_tiles = seq_len / kBc;

  for (int tile = 0; tile < num_tiles; ++tile) {
    // ---- S = Q K^T for this warp's 16 x 32 block ------------------------------------------------
    float s_acc[4][4] = {};
#pragma unroll
    for (int ks = 0; ks < kD / 16; ++ks) {
#pragma unroll
      for (int np = 0; np < 2; ++np) {  // two n8 tiles (keys np*16..) per ldmatrix.x4
        uint32_t b[4];
        ldmatrix_x4(b, kstep_addr(k_addr0, ks) + np * 16 * kD * sizeof(half));
        mma_m16n8k16(s_acc[2 * np], q_frag[ks], b[0], b[1]);
        mma_m16n8k16(s_acc[2 * np + 1], q_frag[ks], b[2], b[3]);
      }
    }
    // fp32 logits -> smem_logits: one stmatrix.x4 per 16x8 tile (matrix i = rows 8*(i/2).., floats
    // 4*(i%2).. of the 8-column group; payload d0/d1/d2/d3 -> matrix 0/1/2/3).
#pragma unroll
    for (int nt = 0; nt < 4; ++nt) {
      const int row = qk_rows + (lane / 16) * 8 + lane % 8;
      const int column = qk_keys + nt * 8 + ((lane / 8) % 2) * 4;
      stmatrix_x4(smem_addr(smem.logits + row * kLogitsStride + column), __float_as_uint(s_acc[nt][0]),
                  __float_as_uint(s_acc[nt][1]), __float_as_uint(s_acc[nt][2]), __float_as_uint(s_acc[nt][3]));
    }
    __syncthreads();  // K no longer read, logits complete

    // V shares the K buffer, so its load can only start now.
    load_tile_async<kBc, kThreads>(smem.kv, v + size_t(tile) * kBc * kD, thread);
    cp_async_commit();

    // ---- online softmax: warp w owns rows 8w..8w+7, four rows per pass ----------------------
#pragma unroll
    for (int pass = 0; pass < kBr / kWarps / kRowsPerSoftmaxPass; ++pass) {
      const int row0 = warp * (kBr / kWarps) + pass * kRowsPerSoftmaxPass;
      float2 x[kRowsPerSoftmaxPass];
      float tile_max[kRowsPerSoftmaxPass], new_max[kRowsPerSoftmaxPass], tile_sum[kRowsPerSoftmaxPass];
#pragma unroll
      for (int r = 0; r < kRowsPerSoftmaxPass; ++r) {
        x[r] = *reinterpret_cast<const float2*>(smem.logits + (row0 + r) * kLogitsStride + 2 * lane);
        tile_max[r] = warp_max(fmaxf(x[r].x, x[r].y));
      }
#pragma unroll
      for (int r = 0; r < kRowsPerSoftmaxPass; ++r) {
        new_max[r] = fmaxf(smem.row_max[row0 + r], tile_max[r]);
        const float neg_max_scaled = -new_max[r] * scale_log2;
        x[r].x = fast_exp2(fmaf(x[r].x, scale_log2, neg_max_scaled));
        x[r].y = fast_exp2(fmaf(x[r].y, scale_log2, neg_max_scaled));
        tile_sum[r] = warp_sum(x[r].x + x[r].y);
        const int row = row0 + r;
        *reinterpret_cast<uint32_t*>(smem.p + swizzle<kBc / kChunkHalves>(row, lane / 4) + 2 * (lane % 4)) =
            pack_half2(x[r].x, x[r].y);
      }
      __syncwarp();  // every lane has read the old row_max before lane 0 overwrites it
      if (lane == 0) {
#pragma unroll
        for (int r = 0; r < kRowsPerSoftmaxPass; ++r) {
          const int row = row0 + r;
          const float rescale = fast_exp2((smem.row_max[row] - new_max[r]) * scale_log2);
          smem.row_rescale[row] = rescale;
          smem.row_sum[row] = smem.row_sum[row] * rescale + tile_sum[r];
          smem.row_max[row] = new_max[r];
        }
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
      ldmatrix_x4(p_frag, kstep_addr(p_addr0, ks));
#pragma unroll
      for (int np = 0; np < 4; ++np) {  // V^T fragments: keys 16ks.. (in logits order), head chunks 2np..
        uint32_t b[4];
        ldmatrix_x4_trans(b, kstep_addr(v_addr0, np) + ks * 16 * kD * sizeof(half));
        mma_m16n8k16(o_acc[2 * np], p_frag, b[0], b[1]);
        mma_m16n8k16(o_acc[2 * np + 1], p_frag, b[2], b[3]);
      }
    }
    __syncthreads();  // V and P no longer read

    if (tile + 1 < num_tiles) {  // the next K tile goes into the same buffer
      load_tile_async<kBc, kThreads>(smem.kv, k + size_t(tile + 1) * kBc * kD, thread);
      cp_async_commit();
      cp_async_wait<0>();
      __syncthreads();
    }
  }

  // ---- O / row_sum -> global, fp16 ---------------------------------------------------------------
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
