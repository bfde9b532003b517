"""TMA tensor maps (CUtensorMap) encoded on the host, and the kernel parameter block that carries them.

A kernel of the Hopper line takes, after its six common parameters, one `const __grid_constant__
CUtensorMap` per array it loads or stores with TMA (q, k, v; o for V19's TMA store): over the
[B*H*S, D] matrix an array is (V14-V24), or from V25 on over [B][H][S][D] by head, so that S has a bound
of its own. A CUtensorMap is 128 opaque bytes, 64-byte aligned,
written by the driver's cuTensorMapEncodeTiled (called here through ctypes on libcuda.so.1: no new
dependency). CuPy's kernel call cannot pass a 128-byte struct, so such a kernel is launched with
cuLaunchKernel and an array of pointers to each argument (`Params`).
"""
from __future__ import annotations

import ctypes

from . import FlashbenchError

TENSOR_MAP_BYTES = 128
TENSOR_MAP_ALIGN = 64

# cuda.h enums (CUDA 12/13)
DATA_TYPES = {"fp16": 6, "bf16": 9}  # CU_TENSOR_MAP_DATA_TYPE_FLOAT16, _BFLOAT16: 2-byte elements both
INTERLEAVE_NONE = 0
SWIZZLE = {0: 0, 32: 1, 64: 2, 128: 3}  # bytes -> CU_TENSOR_MAP_SWIZZLE_{NONE,32B,64B,128B}
L2_PROMOTION_128B = 2  # CU_TENSOR_MAP_L2_PROMOTION_L2_128B
OOB_FILL_NONE = 0


class TensorMap(ctypes.Structure):
    """CUtensorMap: 16 opaque 64-bit words, 64-byte aligned (the alignment is kept by allocation)."""
    _fields_ = [("opaque", ctypes.c_uint64 * (TENSOR_MAP_BYTES // 8))]


def _aligned_tensor_map() -> tuple[TensorMap, object]:
    """A TensorMap at a 64-byte aligned address (ctypes aligns structures to 8 only); returns it and
    the buffer that owns its memory (keep both alive)."""
    buffer = ctypes.create_string_buffer(TENSOR_MAP_BYTES + TENSOR_MAP_ALIGN)
    address = ctypes.addressof(buffer)
    offset = -address % TENSOR_MAP_ALIGN
    return TensorMap.from_buffer(buffer, offset), buffer


_libcuda = None


def libcuda():
    global _libcuda
    if _libcuda is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise FlashbenchError(f"cannot load the CUDA driver (libcuda.so.1) to encode TMA tensor maps: {e}") from None
        lib.cuTensorMapEncodeTiled.restype = ctypes.c_int
        lib.cuTensorMapEncodeTiled.argtypes = [
            ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64),
            ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint32),
            ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        lib.cuGetErrorString.restype = ctypes.c_int
        lib.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        _libcuda = lib
    return _libcuda


def tiled_args(address: int, dims: tuple[int, ...], strides: tuple[int, ...], box: tuple[int, ...],
               swizzle: int, data_type: int = DATA_TYPES["fp16"]) -> dict:
    """The arguments of cuTensorMapEncodeTiled for a tensor of 2-byte elements (`data_type`: fp16 or
    bf16's, DATA_TYPES) at `address` of `dims` elements
    (innermost first, as the driver wants them), `strides` the bytes between consecutive indices of
    each dimension but the innermost, and a box of `box` elements. Raises FlashbenchError where the
    driver's documented limits are broken."""
    if swizzle not in SWIZZLE:
        raise FlashbenchError(f"TMA swizzle must be one of {sorted(SWIZZLE)} bytes, not {swizzle}")
    if address % 16:
        raise FlashbenchError(f"a TMA tensor must start on a 16-byte boundary, {address:#x} does not")
    for stride in strides:
        if stride % 16:
            raise FlashbenchError(f"a TMA stride must be a multiple of 16 bytes, not {stride}")
    if not all(1 <= b <= 256 for b in box) or (box[0] * 2) % 16:
        raise FlashbenchError(f"TMA box {box} must be 1..256 per dimension with a multiple of 16 bytes innermost")
    if swizzle and box[0] * 2 > swizzle:
        raise FlashbenchError(f"a {swizzle}B-swizzled TMA box is at most {swizzle} bytes wide, {box[0]} fp16 are "
                              f"{box[0] * 2}")
    return {"data_type": data_type, "rank": len(dims), "address": address, "dims": tuple(dims),
            "strides": tuple(strides), "box": tuple(box), "element_strides": (1,) * len(dims),
            "interleave": INTERLEAVE_NONE, "swizzle": SWIZZLE[swizzle], "l2_promotion": L2_PROMOTION_128B,
            "oob_fill": OOB_FILL_NONE}


def tiled_2d_args(address: int, rows: int, cols: int, box: tuple[int, int], swizzle: int,
                  data_type: int = DATA_TYPES["fp16"]) -> dict:
    """tiled_args of a row-major [rows, cols] matrix and a box of {box[0] columns, box[1] rows}, no
    larger than the matrix."""
    if box[0] > cols or box[1] > rows:
        raise FlashbenchError(f"TMA box {box} is larger than the [{rows}, {cols}] tensor")
    return tiled_args(address, (cols, rows), (cols * 2,), box, swizzle, data_type)


def by_head_args(address: int, shape: tuple[int, int, int, int], box: tuple[int, int], swizzle: int,
                 strides: tuple[int, int, int] | None = None, data_type: int = DATA_TYPES["fp16"]) -> dict:
    """tiled_args of a [B, H, S, D] array by head: dims {D, S, H, B}, so that S has a bound of its
    own (a box past a head's last row is filled with zeros, a store there clipped), and a box of
    {box[0] columns, box[1] rows} of one head. `strides`: the elements between consecutive b, h and s
    (D's are adjacent); None: C-contiguous. FlashAttention's [B, S, H, D] is the same map with other
    strides."""
    B, H, S, D = shape
    b, h, s = strides if strides is not None else (H * S * D, S * D, D)
    return tiled_args(address, (D, S, H, B), (s * 2, h * 2, b * 2), (*box, 1, 1), swizzle, data_type)


def encode(a: dict) -> tuple[TensorMap, object]:
    """The tensor map tiled_args `a` describe, in device memory's terms; returns (map, owner)."""
    rank = a["rank"]
    tensor_map, owner = _aligned_tensor_map()
    dims = (ctypes.c_uint64 * rank)(*a["dims"])
    strides = (ctypes.c_uint64 * (rank - 1))(*a["strides"])
    box_dims = (ctypes.c_uint32 * rank)(*a["box"])
    element_strides = (ctypes.c_uint32 * rank)(*a["element_strides"])
    lib = libcuda()
    status = lib.cuTensorMapEncodeTiled(ctypes.addressof(tensor_map), a["data_type"], rank,
                                        ctypes.c_void_p(a["address"]), dims, strides, box_dims, element_strides,
                                        a["interleave"], a["swizzle"], a["l2_promotion"], a["oob_fill"])
    if status != 0:
        message = ctypes.c_char_p()
        lib.cuGetErrorString(status, ctypes.byref(message))
        raise FlashbenchError(f"cuTensorMapEncodeTiled failed ({status}: "
                              f"{(message.value or b'unknown error').decode()}) for {a}")
    return tensor_map, owner


def encode_tiled_2d(address: int, rows: int, cols: int, box: tuple[int, int], swizzle: int,
                    data_type: int = DATA_TYPES["fp16"]) -> tuple[TensorMap, object]:
    """A tensor map over a row-major [rows, cols] matrix in device memory; returns (map, owner)."""
    return encode(tiled_2d_args(address, rows, cols, box, swizzle, data_type))


def encode_by_head(address: int, shape: tuple[int, int, int, int], box: tuple[int, int], swizzle: int,
                   strides: tuple[int, int, int] | None = None, data_type: int = DATA_TYPES["fp16"]
                   ) -> tuple[TensorMap, object]:
    """A tensor map over a [B, H, S, D] array by head (by_head_args); returns (map, owner)."""
    return encode(by_head_args(address, shape, box, swizzle, strides, data_type))


class Params:
    """A cuLaunchKernel parameter block: each argument as a ctypes value, and the array of pointers to
    them that kernel_params points at. Holds every value alive as long as itself."""

    def __init__(self, *values):
        self.values = values
        self.pointers = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values))

    @property
    def ptr(self) -> int:
        return ctypes.addressof(self.pointers)
