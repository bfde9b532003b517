// Shared building blocks of every attention kernel version: the PTX wrappers (mma, ldmatrix,
// stmatrix, cp.async), the 128-byte swizzle, the tile loader, and the launch contract that the
// pipeline reads without a GPU. A version file includes this and reads top to bottom like the
// chapter; what changes between versions lives in the version files, never here.
#pragma once
#include <cuda_fp16.h>
#include <cstdint>

namespace flash {

constexpr int kHeadDim = 128;            // the only head dim the case (and the kernels) use
constexpr int kChunkHalves = 8;          // one 16-byte chunk = 8 fp16
constexpr int kRowChunks = kHeadDim / kChunkHalves;  // 16 chunks in a Q/K/V row of 256 bytes

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- 128-byte swizzle --------------------------------------------------------------------
// ldmatrix reads one 16-byte chunk from each of 8 consecutive rows. With rows of 128 or 256
// bytes those chunks would all sit in the same 4 banks (8-way conflict). XOR-ing the chunk
// index with (row % 8) spreads them over all 32 banks:
//   row 0: c0 c1 c2 c3 c4 c5 c6 c7 | ...        chunk c of row r is stored at c ^ (r & 7)
//   row 1: c1 c0 c3 c2 c5 c4 c7 c6 | ...
//   row 2: c2 c3 c0 c1 c6 c7 c4 c5 | ...
template <int kChunksPerRow>
__device__ __forceinline__ int swizzle(int row, int chunk) {  // -> offset in fp16 elements
  return row * kChunksPerRow * kChunkHalves + ((chunk ^ (row & 7)) * kChunkHalves);
}
// The short address chain: a lane keeps its row (mod 8) while it walks the k-steps of a tile, and
// chunk (c + 2k) with c < 2 is stored at ((c ^ row) ^ 2k). So the byte address of k-step k is the
// address of k-step 0 XOR 32k: one LOP3 per ldmatrix, no address register per k-step. The XOR must
// stay inside the row: k < 8 for 256-byte rows, k < 4 for 128-byte rows, and the tile must start
// on a row-size boundary (each kernel static_asserts its SharedStorage offsets).
__device__ __forceinline__ uint32_t kstep_addr(uint32_t kstep0_addr, int kstep) {
  return kstep0_addr ^ (32u * kstep);
}
// Every XOR-ed address (and every pointer offset) is a loop invariant of the tile loop, and the
// compiler hoists each one into a register of its own: up to 8 per ldmatrix stream, enough to
// spill under a 128-register cap. Passing the base through opaque() inside the loop hides it from
// that code motion: the derived addresses are recomputed where used, one LOP3 or IMAD each.
__device__ __forceinline__ uint32_t opaque(uint32_t x) {
  asm volatile("" : "+r"(x));
  return x;
}

// ---- cp.async: global -> shared without passing through registers -------------------------
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPendingGroups>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPendingGroups) : "memory");
}

// Issue the copy of a kRows x 128 fp16 tile (row-major, rows 256 bytes apart in global memory)
// into a 128B-swizzled shared tile. Thread t copies chunk t % 16 of rows t / 16 + step * (kThreads
// / 16): a multiple of 8 rows per step keeps (row % 8), hence the swizzle, fixed per thread, so
// every step is the first one's addresses plus a constant (no address registers per step).
template <int kRows, int kThreads>
__device__ __forceinline__ void load_tile_async(half* tile, const half* src, int thread) {
  constexpr int kRowsPerStep = kThreads / kRowChunks;
  static_assert(kRowsPerStep % 8 == 0 && kRows % kRowsPerStep == 0, "tile rows must split evenly");
  const int row = thread / kRowChunks, chunk = thread % kRowChunks;
  const uint32_t dst = smem_addr(tile + swizzle<kRowChunks>(row, chunk));
  src += row * kHeadDim + chunk * kChunkHalves;
#pragma unroll
  for (int step = 0; step < kRows / kRowsPerStep; ++step)
    cp_async_16(dst + step * kRowsPerStep * kHeadDim * sizeof(half), src + step * kRowsPerStep * kHeadDim);
}

// ---- ldmatrix / stmatrix: 8x8 16-bit matrices between shared memory and mma fragments -------
// Lane l gives the address of row (l % 8) of matrix (l / 8); register i receives matrix i.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
// stmatrix is b16-only; callers may pass any 32-bit payload (fp32 logits included) and must
// account for where it lands: lane l's register i goes to row l/4, bytes 4*(l%4).. of matrix i.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// ---- mma.sync m16n8k16, fp16 in, fp32 accumulate --------------------------------------------
// Accumulator layout (g = lane / 4, q = lane % 4): d0,d1 -> row g, cols 2q, 2q+1;
// d2,d3 -> row g+8, same cols.
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// ---- small math ------------------------------------------------------------------------------
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}
// The 4 lanes of a quad (lane / 4 equal) hold one row of an mma accumulator tile.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// ---- launch guard ------------------------------------------------------------------------------
// The grid must cover S exactly: whole row tiles (gridDim.x * block_rows == S) and whole key
// tiles. A launch that does not (a partial grid would be timed and credited with the full FLOPs)
// traps, so the launch fails loudly rather than leave rows unwritten or keys unread.
__device__ __forceinline__ void require_grid_covers(int seq_len, int block_rows, int block_cols) {
  if (int(gridDim.x) * block_rows != seq_len || seq_len % block_cols != 0) __trap();
}
// A persistent kernel (V18 on) is launched on a grid of its own size (about one block per SM, y = 1)
// and walks the logical grid (row_tiles, heads) it is given as its two last parameters: the same
// rule holds for that grid (row_tiles * block_rows == S, whole key tiles). Called before anything
// waits on anything: a grid without whole key tiles would otherwise leave a consumer waiting for a
// tile no one loads.
__device__ __forceinline__ void require_tiles_cover(int seq_len, int row_tiles, int heads, int block_rows,
                                                    int block_cols) {
  if (row_tiles * block_rows != seq_len || seq_len % block_cols != 0 || heads < 1 || gridDim.y != 1) __trap();
}

}  // namespace flash

// ---- launch contract -------------------------------------------------------------------------
// Every version states once how it must be launched: FLASH_LAUNCH_CONTRACT puts a LaunchContract,
// made from the very constants and structs the kernel uses, into the cubin as the constant
// flash_launch_contract. The compile stage reads it from the cubin's symbol table (no GPU and no
// second build needed), and the launcher launches as it says.
// Kernel signature shared by all versions (grid = (S / block_rows, B * H)):
//   extern "C" __global__ void flash_attention_forward(const half* q, const half* k, const half* v,
//                                                      half* o, int seq_len, float scale_log2);
// (The Hopper line adds tensor maps after these six, and a persistent kernel its logical grid after
// those, on a grid of its own size: hopper.cuh's contract macros.)
namespace flash {
// int fields in this order: flashbench/compile.py (CONTRACT_FIELDS) reads them so.
struct LaunchContract {
  int threads;
  int block_rows;          // query rows per block (per work tile, for a persistent kernel)
  int block_cols;          // keys per K/V tile: S must be a multiple
  int dynamic_smem_bytes;
  int head_dim;
  int tensor_maps;         // maps passed after the six common parameters: 0, 3 (q, k, v) or 4 (q, k, v, o)
  int box_cols;            // the maps' box: box_cols x (q_box_rows | kv_box_rows | o_box_rows) elements,
  int q_box_rows;          //   swizzled in swizzle_bytes
  int kv_box_rows;
  int o_box_rows;
  int swizzle_bytes;
  int ctas_per_sm;         // a persistent kernel (V18 on): blocks per SM; 0: a block per row tile and head
  int tensor_map_rank;     // 2: maps over the [B*H*S, D] view; 4 (V25 on): over [B][H][S][D] by head, any S
  int causal;              // 1: the kernel masks keys after each query (built with FLASH_CAUSAL=1)
  int work_list;           // 1 (V25 on): it walks the work tiles the launch lists for its grid (hopper.cuh)
  int l2_section_bytes;    //   in sections of heads whose K and V fit in this many bytes (0: one head)
  int ragged_first_keys;   // (V25 on) n: a second entry, flash_attention_forward_ragged_first, for the S
                           //   whose last key tile holds 1 to n keys (0: none)
  int bf16;                // 1: Q, K, V and O are bf16 (built with FLASH_BF16=1); 0: fp16
  int grouped_kv;          // 1 (V25 on, FLASH_GROUPED_KV=1): K and V have H / kv_group heads, each read by
                           //   kv_group query heads (kv_group: a launch parameter, which others ignore)
};
}  // namespace flash
#define FLASH_LAUNCH_CONTRACT_FIELDS(threads, block_rows, block_cols, dynamic_smem_bytes, head_dim, tensor_maps,   \
                                     box_cols, q_box_rows, kv_box_rows, o_box_rows, swizzle_bytes, ctas_per_sm,     \
                                     tensor_map_rank, causal, work_list, l2_section_bytes, ragged_first_keys, bf16, \
                                     grouped_kv)                                                                   \
  extern "C" __device__ const flash::LaunchContract flash_launch_contract = {                                    \
      int(threads),     int(block_rows), int(block_cols),  int(dynamic_smem_bytes), int(head_dim),              \
      int(tensor_maps), int(box_cols),   int(q_box_rows),  int(kv_box_rows),        int(o_box_rows),            \
      int(swizzle_bytes), int(ctas_per_sm), int(tensor_map_rank), int(causal), int(work_list), int(l2_section_bytes), \
      int(ragged_first_keys), int(bf16), int(grouped_kv)};
#define FLASH_LAUNCH_CONTRACT(threads, block_rows, block_cols, dynamic_smem_bytes)                             \
  FLASH_LAUNCH_CONTRACT_FIELDS(threads, block_rows, block_cols, dynamic_smem_bytes, flash::kHeadDim, 0, 0, 0, 0, 0, \
                               0, 0, 0, 0, 0, 0, 0, 0, 0)
