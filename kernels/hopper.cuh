// Hopper's own building blocks (sm_90a only): TMA tensor loads, mbarriers, and wgmma with its
// shared-memory matrix descriptors. The Hopper line (V14 on) includes this after flash_common.cuh;
// each version file holds its schedule, this file only the instructions.
//
// Everything here is an `a`-feature of sm_90 (wgmma, setmaxnreg) or at least Hopper's (TMA,
// mbarrier tx-counts): built with -gencode=arch=compute_90a,code=sm_90a, run on an sm_90 GPU only.
// SM100/SM103 have TMA too but multiply with tcgen05, not wgmma: these kernels are not for them.
#pragma once
#include <cuda.h>  // CUtensorMap: the 128-byte tensor map the host encodes (cuTensorMapEncodeTiled)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>
#include <type_traits>

#include "flash_common.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "the Hopper line needs sm_90a: build with -gencode=arch=compute_90a,code=sm_90a"
#endif

namespace flash::hopper {

// ---- the element type: fp16 (half) or bf16 (__nv_bfloat16) ---------------------------------------
// Both are 2 bytes, so every tile, box, swizzle and descriptor below is the same for either; what
// differs is the wgmma's input type, and how a pair of floats is rounded into one 32-bit register or
// read back out of one. The V14-V24 files use half throughout; V25 on takes the type as a parameter.
template <typename T>
constexpr bool kIsBf16 = std::is_same_v<T, __nv_bfloat16>;
template <typename T>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  if constexpr (kIsBf16<T>) {
    const __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&b);
  } else {
    return pack_half2(lo, hi);
  }
}
template <typename T>
__device__ __forceinline__ float2 unpack_pair(const T* pair) {
  if constexpr (kIsBf16<T>) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(pair));
  } else {
    return __half22float2(*reinterpret_cast<const __half2*>(pair));
  }
}

// ---- shared-memory layout of a TMA tile, 128-byte swizzle ------------------------------------
// A 128-byte-swizzled TMA box is at most 128 bytes (64 fp16) wide, so a [rows][128] fp16 tile is
// loaded as two boxes, its head columns 0-63 and 64-127, one after the other in shared memory (a
// [rows][D] tile as D / 64 of them, from V25 on):
//
//   half 0: [rows][64 fp16] = rows x 128 B     half 1: the same for columns 64-127
//   row r, 16-byte chunk c (8 fp16) lives at  r * 128 + ((c ^ (r % 8)) * 16)   (the TMA swizzle)
//
// Eight rows make one 1024-byte swizzle atom; every box must start on a 1024-byte boundary (the
// swizzle is a function of the address bits, and the descriptors below assume base offset 0).
constexpr int kBoxCols = 64;                        // fp16 columns per TMA box (128 bytes)
constexpr int kBoxRowBytes = kBoxCols * 2;          // 128
constexpr int kAtomBytes = 8 * kBoxRowBytes;        // 1024: eight swizzled rows
constexpr int kSwizzleBytes = kBoxRowBytes;         // the tensor maps' swizzle: one box row is one span

// ---- small PTX wrappers ------------------------------------------------------------------------
__device__ __forceinline__ uint32_t elect_lane0() { return (threadIdx.x % 32) == 0; }

// Ordinary shared-memory stores become visible to the async proxy (TMA, wgmma) only after this.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// ---- mbarrier ---------------------------------------------------------------------------------
// A 64-bit shared-memory barrier with an arrival count and a transaction (byte) count. A phase
// completes when `count` threads have arrived and every expected byte has landed; its parity bit
// then flips. Waiters name the parity of the phase they wait for: (use number) & 1.
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// After the inits, before anyone (TMA included) uses the barriers.
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// Arrive once and announce `bytes` more to come from TMA (the producer's half of a phase).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(smem_addr(bar)), "r"(parity)
      : "memory");
  return done != 0;
}
// Wait until the phase of parity `parity` has completed (try_wait itself sleeps a while per try).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

// ---- TMA: a 2-D box of a tensor map -> shared memory, completing on an mbarrier ----------------
// The tensor map lives in kernel parameter space (const __grid_constant__ CUtensorMap); its generic
// address is what the instruction takes. coords: {column (innermost), row}, in elements.
__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* map, uint64_t* bar, int col, int row) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(smem_addr(bar))
      : "memory");
}
// A [rows][128] fp16 tile starting at `row`: two boxes, head columns 0-63 then 64-127.
template <int kRows>
__device__ __forceinline__ void tma_load_tile(half* dst, const CUtensorMap* map, uint64_t* bar, int row) {
  tma_load_2d(dst, map, bar, 0, row);
  tma_load_2d(dst + kRows * kBoxCols, map, bar, kBoxCols, row);
}

// ---- TMA store: shared memory -> a 2-D box of a tensor map (V19 on) -----------------------------
// The other direction: the box at {col, row} of the map is written from shared memory laid out as a
// load of the same box would have left it (the map's swizzle). Ordinary shared-memory writes of the
// source must be made visible to the async proxy first (fence_proxy_async, by every writing thread,
// then a barrier before the one thread that stores). A store joins the issuing thread's current
// bulk async-group; commit closes it, and wait_group(_read) waits for that thread's own groups only.
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* map, const void* src, int col, int row) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(col), "r"(row), "r"(smem_addr(src))
               : "memory");
}
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Until at most kInFlight of this thread's bulk groups have not yet finished *reading* shared memory
// (their source may be overwritten; the global writes may still be under way).
template <int kInFlight>
__device__ __forceinline__ void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(kInFlight) : "memory");
}
// Until at most kInFlight of this thread's bulk groups are complete, global writes included.
template <int kInFlight>
__device__ __forceinline__ void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(kInFlight) : "memory");
}

// ---- wgmma shared-memory matrix descriptor ------------------------------------------------------
// 64 bits (PTX ISA "matrix descriptor"; CUTLASS's GmmaDescriptor):
//   bits  0-13  start address >> 4        bits 16-29  leading-dimension byte offset >> 4 (LBO)
//   bits 32-45  stride-dimension byte offset >> 4 (SBO)
//   bits 49-51  base offset (0: every swizzle atom is 1024-byte aligned)
//   bits 62-63  layout: 1 = 128-byte swizzle
// K-major (the reduction dimension contiguous: Q and K in QK^T), 128B swizzle: rows of 128 bytes,
//   8-row atoms SBO = 1024 bytes apart; LBO unused (1). The k16 slice k of a 64-column box starts
//   32*k bytes further (the swizzle is applied to the address bits by the hardware).
// MN-major (the output dimension contiguous: V as B of P V, head dim contiguous), 128B swizzle:
//   each row (one key) holds 64 head columns; LBO = distance between the 64-column blocks along N
//   (our boxes), SBO = distance between 8-row (8-key) groups along K = 1024 bytes. The
//   k16 slice k (keys 16k..) starts 16 rows = 2048*k bytes further.
__device__ __forceinline__ uint64_t make_desc_sw128(uint32_t smem_byte_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return uint64_t((smem_byte_addr & 0x3FFFF) >> 4) | (uint64_t((lbo_bytes >> 4) & 0x3FFF) << 16) |
         (uint64_t((sbo_bytes >> 4) & 0x3FFF) << 32) | (uint64_t(1) << 62);
}
// Advance a descriptor's start address by `bytes` (a multiple of 16, no carry out of 14 bits: the
// whole of shared memory is below 256 KB).
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

// ---- wgmma ----------------------------------------------------------------------------------------
// Issued by a whole warpgroup (4 consecutive warps, the first one's index divisible by 4). The
// accumulator of m64nNk16 is spread over the warpgroup like mma.sync's, warp w holding rows
// 16w..16w+15 (g = lane / 4, q = lane % 4; n8 block i of the N columns):
//   d[4i + 0], d[4i + 1] -> row 16w + g,     columns 8i + 2q, 8i + 2q + 1
//   d[4i + 2], d[4i + 3] -> row 16w + g + 8, the same columns
// An A operand from registers (m64k16, fp16) has the same shape as a 64x16 accumulator packed in
// pairs: a0 = (row g, cols 2q..), a1 = (row g+8, cols 2q..), a2 = (row g, cols 2q+8..),
// a3 = (row g+8, cols 2q+8..). So P's k16 slice kk is accumulator blocks 2kk and 2kk+1, packed.
//
// fence: before the first wgmma that touches registers last written by ordinary instructions.
// commit: closes a group of issued wgmmas; wait<N>: until at most N groups are in flight.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int kInFlight>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kInFlight) : "memory");
}
// Keeps the compiler from moving reads or writes of an accumulator across the asynchronous
// wgmma (issue .. wait): an empty asm that "reads and writes" each register.
template <int kN>
__device__ __forceinline__ void fence_regs(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int kN>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+r"(r[i])::"memory");
}

// The accumulators' operand lists of a wgmma: %0 .. %15, .. %31, .. %63, .. %127, each a prefix of the next.
#define FLASH_REGS16                                                                                        \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define FLASH_REGS32                                                                                        \
  FLASH_REGS16 ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define FLASH_REGS64                                                                                        \
  FLASH_REGS32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "         \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define FLASH_REGS128                                                                                       \
  FLASH_REGS64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "         \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "                        \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "            \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define FLASH_D8(i)                                                                                         \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7])
#define FLASH_D16 FLASH_D8(0), FLASH_D8(8)
#define FLASH_D32 FLASH_D16, FLASH_D8(16), FLASH_D8(24)
#define FLASH_D64 FLASH_D32, FLASH_D8(32), FLASH_D8(40), FLASH_D8(48), FLASH_D8(56)
#define FLASH_D128                                                                                          \
  FLASH_D64, FLASH_D8(64), FLASH_D8(72), FLASH_D8(80), FLASH_D8(88), FLASH_D8(96), FLASH_D8(104), FLASH_D8(112), \
      FLASH_D8(120)
// One wgmma m64nNk16 (SHAPE), its input type TYPES (T's: f16 or bf16, for A and B both; the accumulator is
// f32 in either), its accumulators D (REGS their operand list, the outputs last: their constraints), and
// the operands that follow them, numbered after the accumulators (the numbers given: PTX names operands
// by position). accumulate = 0 overwrites D (the first k-step of a product), 1 adds to it.
//   _SS:    A and B from shared memory, both K-major (no transpose): desc_a %DA, desc_b %DB, accumulate %P
//   _RS_BT: A from registers (4 pairs of T, operands A), B from shared memory MN-major (transpose flag set:
//           B's N dimension is the contiguous one): desc_b %DB, accumulate %P
#define FLASH_WGMMA_SS(TYPES, SHAPE, REGS, DA, DB, P, ...)                                                  \
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %" #P ", 0;\n"                                         \
               " wgmma.mma_async.sync.aligned." SHAPE ".f32." TYPES " {" REGS "}"                           \
               ", %" #DA ", %" #DB ", p, 1, 1, 0, 0;\n}\n"                                                   \
               : __VA_ARGS__                                                                                \
               : "l"(desc_a), "l"(desc_b), "r"(accumulate))
#define FLASH_WGMMA_RS_BT(TYPES, SHAPE, REGS, A, DB, P, ...)                                                \
  asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, %" #P ", 0;\n"                                         \
               " wgmma.mma_async.sync.aligned." SHAPE ".f32." TYPES " {" REGS "}"                           \
               ", " A ", %" #DB ", p, 1, 1, 1;\n}\n"                                                        \
               : __VA_ARGS__                                                                                \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate))
// The wgmma of T's input type: WGMMA (one of the two above) with the PTX type pair, then the rest.
#define FLASH_WGMMA_OF(T, WGMMA, ...)                                                                       \
  if constexpr (kIsBf16<T>) WGMMA("bf16.bf16", __VA_ARGS__);                                                \
  else WGMMA("f16.f16", __VA_ARGS__)

// D[64x128] (+)= A[64x16] B[16x128], both from shared memory. T: half or __nv_bfloat16.
template <typename T = half>
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  FLASH_WGMMA_OF(T, FLASH_WGMMA_SS, "m64n128k16", FLASH_REGS64, 64, 65, 66, FLASH_D64);
}
// The same at N = 32 (QK of a key tile S ends in the first quarter of): D is the first 16
// accumulators, keys 0..31 of the tile.
template <typename T = half>
__device__ __forceinline__ void wgmma_m64n32k16_ss(float (&d)[16], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  FLASH_WGMMA_OF(T, FLASH_WGMMA_SS, "m64n32k16", FLASH_REGS16, 16, 17, 18, FLASH_D16);
}
// The same at N = 64 (QK of a key tile of 64 keys, at head dim 256): D is 32 accumulators.
template <typename T = half>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  FLASH_WGMMA_OF(T, FLASH_WGMMA_SS, "m64n64k16", FLASH_REGS32, 32, 33, 34, FLASH_D32);
}
// Any of the three, by the accumulators given: N = 2 x their count (QK of 128, 64 or 32 keys).
template <typename T, int kAcc>
__device__ __forceinline__ void wgmma_m64k16_ss(float (&d)[kAcc], uint64_t desc_a, uint64_t desc_b, int accumulate) {
  static_assert(kAcc == 64 || kAcc == 32 || kAcc == 16, "QK at N = 128, 64 or 32");
  if constexpr (kAcc == 64) wgmma_m64n128k16_ss<T>(d, desc_a, desc_b, accumulate);
  else if constexpr (kAcc == 32) wgmma_m64n64k16_ss<T>(d, desc_a, desc_b, accumulate);
  else wgmma_m64n32k16_ss<T>(d, desc_a, desc_b, accumulate);
}
// D[64x128] (+)= A[64x16] B[16x128], A from registers, B from shared memory MN-major.
template <typename T = half>
__device__ __forceinline__ void wgmma_m64n128k16_rs_bt(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b,
                                                       int accumulate) {
  FLASH_WGMMA_OF(T, FLASH_WGMMA_RS_BT, "m64n128k16", FLASH_REGS64, "{%64, %65, %66, %67}", 68, 69, FLASH_D64);
}
// The same at N = 64 (PV at head dim 64): D is 32 accumulators.
template <typename T = half>
__device__ __forceinline__ void wgmma_m64n64k16_rs_bt(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b,
                                                      int accumulate) {
  FLASH_WGMMA_OF(T, FLASH_WGMMA_RS_BT, "m64n64k16", FLASH_REGS32, "{%32, %33, %34, %35}", 36, 37, FLASH_D32);
}
// D[64x256] (+)= A[64x16] B[16x256]: PV at head dim 256, in one wgmma (128 accumulators).
template <typename T = half>
__device__ __forceinline__ void wgmma_m64n256k16_rs_bt(float (&d)[128], const uint32_t (&a)[4], uint64_t desc_b,
                                                       int accumulate) {
  FLASH_WGMMA_OF(T, FLASH_WGMMA_RS_BT, "m64n256k16", FLASH_REGS128, "{%128, %129, %130, %131}", 132, 133, FLASH_D128);
}
// Any of the three, by the accumulators given: N = 2 x their count (PV at head dim 256, 128 or 64).
template <typename T, int kAcc>
__device__ __forceinline__ void wgmma_m64k16_rs_bt(float (&d)[kAcc], const uint32_t (&a)[4], uint64_t desc_b,
                                                   int accumulate) {
  static_assert(kAcc == 128 || kAcc == 64 || kAcc == 32, "PV at N = 256, 128 or 64");
  if constexpr (kAcc == 128) wgmma_m64n256k16_rs_bt<T>(d, a, desc_b, accumulate);
  else if constexpr (kAcc == 64) wgmma_m64n128k16_rs_bt<T>(d, a, desc_b, accumulate);
  else wgmma_m64n64k16_rs_bt<T>(d, a, desc_b, accumulate);
}
#undef FLASH_WGMMA_OF
#undef FLASH_WGMMA_RS_BT
#undef FLASH_WGMMA_SS
#undef FLASH_D128
#undef FLASH_D64
#undef FLASH_D32
#undef FLASH_D16
#undef FLASH_D8
#undef FLASH_REGS16
#undef FLASH_REGS32
#undef FLASH_REGS64
#undef FLASH_REGS128

// ---- warpgroup register reallocation (V15 on) ----------------------------------------------------
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs)); }
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs)); }

// ---- named barriers (V16 on) ----------------------------------------------------------------------
// The 16 hardware barriers of a block; id 0 is __syncthreads'. `threads` (a multiple of 32) is how
// many arrivals complete the barrier: those that sync wait for it, those that arrive do not.
// Both are .aligned: every thread of a warp executes the same one.
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- an element of a swizzled tile, read by ordinary loads (V23's rare path) -----------------------
// Where element (r, c) of a [kRows][D] tile of 2-byte elements laid out as at the top of this file lies:
// box c / 64, row r, its 16-byte chunk swizzled with the row.
template <int kRows, typename T>
__device__ __forceinline__ const T* tile_element(const T* tile, int r, int c) {
  static_assert(sizeof(T) == 2, "a tile of 2-byte elements");
  const int chunk = (c % kBoxCols) / 8;
  return reinterpret_cast<const T*>(reinterpret_cast<const char*>(tile) + (c / kBoxCols) * kRows * kBoxRowBytes +
                                    r * kBoxRowBytes + ((chunk ^ (r % 8)) * 16) + (c % 8) * 2);
}


// ==== the machinery of a warp-specialised persistent kernel (V25 on) =================================
// V18-V24 each wrote these inline; from V25 on a version file holds its schedule and takes them here.

// ---- TMA over [B][H][S][D] by head (4-D maps, V25 on) --------------------------------------------
// A map of rank 4 has dims {D, S, H, B} (innermost first) and its own bound on S: a box that reaches
// past the head's last row is filled with zeros on a load and clipped on a store, so S may be any
// length and a tile never reads into the next head. coords: {column, row in the head, head, batch}.
// The mbarrier still counts the whole box's bytes, the filled ones included.
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, uint64_t* bar, int col, int row,
                                            int head, int batch) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(smem_addr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(row), "r"(head), "r"(batch), "r"(smem_addr(bar))
      : "memory");
}
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, const void* src, int col, int row, int head,
                                             int batch) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(col), "r"(row), "r"(head), "r"(batch), "r"(smem_addr(src))
               : "memory");
}
// A [rows][D] tile of one head from `row` on: head columns 0-63, then 64-127 and on, one box of 64 each.
template <int kRows, int kHeadCols, typename T>
__device__ __forceinline__ void tma_load_head_tile(T* dst, const CUtensorMap* map, uint64_t* bar, int row, int head,
                                                   int batch) {
  static_assert(kHeadCols % kBoxCols == 0 && kHeadCols <= 256, "one to four boxes of 64 columns");
  tma_load_4d(dst, map, bar, 0, row, head, batch);
#pragma unroll
  for (int box = 1; box < kHeadCols / kBoxCols; ++box)
    tma_load_4d(dst + box * kRows * kBoxCols, map, bar, box * kBoxCols, row, head, batch);
}

// ---- a ring of buffers, each with a full and an empty barrier ----------------------------------------
// The position of the next buffer to fill (the producer's) or to use (a consumer's): stage s of the
// ring, and the parity of that stage's current use. Both sides walk the same sequence of tiles, one
// advance() per tile, so they agree on every tile's stage without telling each other. A consumer
// waits for full[stage] at `phase`; the producer waits for empty[stage] at `phase ^ 1`, which on
// the first round is the phase before a fresh barrier's first and so is already complete.
template <int kStages>
struct Ring {
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == kStages) stage = 0, phase ^= 1;
  }
  __device__ __forceinline__ int previous_stage() const { return stage == 0 ? kStages - 1 : stage - 1; }
};

// ---- the persistent grid's work tiles, in the order the launch lists them (V25 on) ---------------
// A work tile is one row tile of one head. The launch makes the list (flashbench/work_list.py: longest
// first, in sections of heads that share their K and V in L2, each work tile to the block that frees
// first) in records of four ints, one 16-byte load each, for a grid of G blocks:
//   records 0 .. G-1   block b's first work tile: {row tile, head, batch, begin(b)}
//   record G           {G, the work tiles, heads, begin(G)}: the grid, the count and the heads per batch
//                      it was made for
//   records G+1 ..     each block's other work tiles {row tile, head, batch, 0}, block after block:
//                      block b's are records G + 1 + begin(b) .. G + begin(b + 1)
// So a block's first read is its own first work tile, the next block's begin and record G, at places
// known without another read: one round trip before its first load, not one per value read. What a
// whole warp reads, it reads through a shuffle from lane 0 (as V20's warpgroup index), so that the
// compiler holds it, and all that follows from it (a work tile's key tiles, the K/V ring's stage, the
// wgmma descriptors made from that), in uniform registers.
struct WorkTile {
  int row_tile, head, batch;
};
struct WorkList {
  WorkTile first;       // this block's first work tile
  const int4* others;   // its others, in order
  int count;
  // The three records a block starts from, as loaded by every thread: issued at the kernel's top, so that
  // the set-up before the roles split runs while they are in flight.
  struct Head {
    int4 mine;
    int next_begin;
    int4 made_for;
  };
  __device__ __forceinline__ static Head head_of_this_block(const int4* list) {
    return {__ldg(list + blockIdx.x), __ldg(&list[blockIdx.x + 1].w),
            __ldg(list + gridDim.x)};
  }
  // By every thread, before the roles split: traps on a list made for another grid, work tile count or
  // number of heads per batch (whose work tiles would name other heads and batches).
  __device__ __forceinline__ static WorkList of_this_block(const int4* list, const Head& head, int work_tiles,
                                                          int heads) {
    if (head.made_for.x != int(gridDim.x) || head.made_for.y != work_tiles || head.made_for.z != heads) __trap();
    const int begin = __shfl_sync(0xffffffff, head.mine.w, 0);
    const WorkTile first{__shfl_sync(0xffffffff, head.mine.x, 0), __shfl_sync(0xffffffff, head.mine.y, 0),
                         __shfl_sync(0xffffffff, head.mine.z, 0)};
    return {first, list + gridDim.x + 1 + begin, 1 + __shfl_sync(0xffffffff, head.next_begin, 0) - begin};
  }
  // The work tile this block takes in its round `round` (< count), read by one thread. (A loop over the
  // rounds runs to `count`: one whose test is the tile read would hold its whole body, the ring and the
  // descriptors, in ordinary registers.)
  __device__ __forceinline__ WorkTile tile(int round) const {
    if (round == 0) return first;
    const int4 r = __ldg(others + round - 1);
    return {r.x, r.y, r.z};
  }
  // The same, by a whole warp.
  __device__ __forceinline__ WorkTile tile_by_warp(int round) const {
    const WorkTile t = tile(round);
    return {__shfl_sync(0xffffffff, t.row_tile, 0), __shfl_sync(0xffffffff, t.head, 0),
            __shfl_sync(0xffffffff, t.batch, 0)};
  }
};

// ---- epilogue: a warpgroup's 64 rows of O, normalised, into the swizzled O tile (V19 on) -------------
// stmatrix x4 number j writes head columns 16j..16j+15 of the warp's 16 rows: its four 8x8 matrices
// are (rows 0-7, n8 block 2j), (rows 8-15, 2j), (rows 0-7, 2j + 1), (rows 8-15, 2j + 1), i.e.
// accumulators o_acc[8j + 0..1], [8j + 2..3], [8j + 4..5], [8j + 6..7] of this thread (row g or g + 8,
// columns 2 quad, 2 quad + 1 of the block: stmatrix's own fragment). Lane l gives the address of row
// l % 8 of matrix l / 8: tile row st_row, 16-byte chunk 2j + l / 16 of its 256 bytes, in half chunk / 8
// at swizzled chunk (chunk % 8) ^ (st_row % 8). `inv`: 1 / the row sums of rows g and g + 8. T: O's
// element type; kAcc: the accumulators of a row pair, D / 2 (64 at D = 128, 32 at D = 64, 128 at D = 256).
template <int kTileRows, typename T, int kAcc>
__device__ __forceinline__ void write_o_rows(T* o_tile, int first_row, const float (&o_acc)[kAcc],
                                             const float (&inv)[2]) {
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int st_row = first_row + warp * 16 + ((lane / 8) % 2) * 8 + lane % 8;
  const uint32_t st_base = smem_addr(o_tile) + st_row * kBoxRowBytes;
#pragma unroll
  for (int j = 0; j < kAcc / 8; ++j) {
    const int chunk = 2 * j + lane / 16;
    const uint32_t addr = st_base + (chunk / 8) * (kTileRows * kBoxRowBytes) + ((chunk % 8) ^ (st_row % 8)) * 16;
    stmatrix_x4(addr, pack_pair<T>(o_acc[8 * j + 0] * inv[0], o_acc[8 * j + 1] * inv[0]),
                pack_pair<T>(o_acc[8 * j + 2] * inv[1], o_acc[8 * j + 3] * inv[1]),
                pack_pair<T>(o_acc[8 * j + 4] * inv[0], o_acc[8 * j + 5] * inv[0]),
                pack_pair<T>(o_acc[8 * j + 6] * inv[1], o_acc[8 * j + 7] * inv[1]));
  }
}

// ---- launch guard of a kernel on 4-D maps ------------------------------------------------------------
// Any S of at least one row: the logical grid is ceil(rows / block_rows) row tiles of batch_heads = B*H
// heads, heads of them per batch, in groups of kv_group that read one K/V head; `seq_len` the rows the
// row tiles cover (S, or more where the kernel places rows before row 0: V25's row_shift).
__device__ __forceinline__ void require_head_tiles_cover(int seq_len, int row_tiles, int batch_heads, int heads,
                                                         int kv_group, int block_rows) {
  if (seq_len < 1 || row_tiles != (seq_len + block_rows - 1) / block_rows || heads < 1 || batch_heads < heads ||
      batch_heads % heads != 0 || kv_group < 1 || heads % kv_group != 0 || gridDim.y != 1)
    __trap();
}

}  // namespace flash::hopper

// ---- launch contract of a kernel that takes tensor maps -----------------------------------------
// As FLASH_LAUNCH_CONTRACT, plus the tensor maps the launcher must encode and pass after the six
// common parameters, in this order: q, k, v, each over the [B*H*S, 128] fp16 view of its array,
// 128-byte swizzle, box {64 columns, box rows}:
//   flash_attention_forward(q, k, v, o, seq_len, scale_log2, tmap_q, tmap_k, tmap_v)
//
// FLASH_LAUNCH_CONTRACT_TMA_PERSISTENT (V18 on): a persistent kernel. The launcher launches
// grid (min(ctas_per_sm * SMs, row tiles * heads), 1), the SM count read from the device, and passes
// the logical grid, the one a non-persistent kernel is launched on, as two more int parameters:
//   flash_attention_forward(q, k, v, o, seq_len, scale_log2, tmap_q, tmap_k, tmap_v, row_tiles, heads)
// with row_tiles = S / block_rows and heads = B*H. The blocks walk its row_tiles * heads work tiles
// among themselves; the kernel traps unless row_tiles * block_rows == S (require_tiles_cover).
//
// FLASH_LAUNCH_CONTRACT_TMA_PERSISTENT_O (V19 on): as the persistent one, plus a fourth map over o
// (box {64 columns, o_box_rows}, 128-byte swizzle) that the kernel stores O through, passed after v's:
//   flash_attention_forward(q, k, v, o, seq_len, scale_log2, tmap_q, tmap_k, tmap_v, tmap_o, row_tiles, heads)
#define FLASH_LAUNCH_CONTRACT_TMA(threads, block_rows, block_cols, dynamic_smem_bytes, q_box_rows, kv_box_rows)     \
  FLASH_LAUNCH_CONTRACT_FIELDS(threads, block_rows, block_cols, dynamic_smem_bytes, flash::kHeadDim, 3,             \
                               flash::hopper::kBoxCols, q_box_rows, kv_box_rows, 0, flash::hopper::kSwizzleBytes, 0, 2, \
                               0, 0, 0, 0, 0, 0)
#define FLASH_LAUNCH_CONTRACT_TMA_PERSISTENT(threads, block_rows, block_cols, dynamic_smem_bytes, q_box_rows,      \
                                             kv_box_rows, ctas_per_sm)                                              \
  FLASH_LAUNCH_CONTRACT_FIELDS(threads, block_rows, block_cols, dynamic_smem_bytes, flash::kHeadDim, 3,             \
                               flash::hopper::kBoxCols, q_box_rows, kv_box_rows, 0, flash::hopper::kSwizzleBytes,       \
                               ctas_per_sm, 2, 0, 0, 0, 0, 0, 0)
#define FLASH_LAUNCH_CONTRACT_TMA_PERSISTENT_O(threads, block_rows, block_cols, dynamic_smem_bytes, q_box_rows,    \
                                               kv_box_rows, o_box_rows, ctas_per_sm)                                \
  FLASH_LAUNCH_CONTRACT_FIELDS(threads, block_rows, block_cols, dynamic_smem_bytes, flash::kHeadDim, 4,             \
                               flash::hopper::kBoxCols, q_box_rows, kv_box_rows, o_box_rows,                            \
                               flash::hopper::kSwizzleBytes, ctas_per_sm, 2, 0, 0, 0, 0, 0, 0)
//
// FLASH_LAUNCH_CONTRACT_HEAD_MAPS (V25 on): a persistent kernel on 4-D maps over q, k, v and o, each
// {D, S, H, B} by head (box {64 columns, box rows, 1, 1}), of fp16 or where `bf16` bf16; it takes any
// S, masks keys after each query where `causal`, and where `grouped_kv` K and V of H / kv_group heads
// each (query head h reads K/V head h / kv_group; without it kv_group must be 1). After the maps it
// takes the logical grid, the heads per batch, kv_group and the work list the launch makes for its grid
// (WorkList, its records; sections of heads whose K and V fit in l2_section_bytes, 0: one K/V head a
// section):
//   flash_attention_forward(q, k, v, o, seq_len, scale_log2, tmap_q, tmap_k, tmap_v, tmap_o, row_tiles,
//                           batch_heads, heads, kv_group, work_list)
// with row_tiles = ceil((S + row_shift) / block_rows) (row_shift: the rows a causal ragged-first entry places
// before row 0, else 0), batch_heads = B*H (require_head_tiles_cover, WorkList).
// Where ragged_first_keys is n > 0, the same parameters go to flash_attention_forward_ragged_first for
// an S with 0 < S mod block_cols <= n.
#define FLASH_LAUNCH_CONTRACT_HEAD_MAPS(threads, block_rows, block_cols, dynamic_smem_bytes, head_dim, q_box_rows, \
                                        kv_box_rows, o_box_rows, ctas_per_sm, causal, l2_section_bytes,             \
                                        ragged_first_keys, bf16, grouped_kv)                                        \
  FLASH_LAUNCH_CONTRACT_FIELDS(threads, block_rows, block_cols, dynamic_smem_bytes, head_dim, 4,                   \
                               flash::hopper::kBoxCols, q_box_rows, kv_box_rows, o_box_rows,                            \
                               flash::hopper::kSwizzleBytes, ctas_per_sm, 4, causal, 1, l2_section_bytes,               \
                               ragged_first_keys, bf16, grouped_kv)
