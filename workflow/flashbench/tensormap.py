"""TMA tensor maps (CUtensorMap) encoded on the host, and the kernel parameter block that carries them.

A kernel of the Hopper line takes, after its six common parameters, one `const __grid_constant__
CUtensorMap` per array it loads or stores with TMA (q, k, v; o for V19's TMA store). A CUtensorMap is 128 opaque bytes, 64-byte aligned,
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
DATA_TYPE_FLOAT16 = 6  # CU_TENSOR_MAP_DATA_TYPE_FLOAT16
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


def tiled_2d_args(address: int, rows: int, cols: int, box: tuple[int, int], swizzle: int) -> dict:
    """The arguments of cuTensorMapEncodeTiled for a row-major [rows, cols] fp16 matrix at `address`
    and a box of {box[0] columns, box[1] rows} (innermost dimension first, as the driver wants it).
    Raises FlashbenchError where the driver's documented limits are broken."""
    box_cols, box_rows = box
    if swizzle not in SWIZZLE:
        raise FlashbenchError(f"TMA swizzle must be one of {sorted(SWIZZLE)} bytes, not {swizzle}")
    if address % 16:
        raise FlashbenchError(f"a TMA tensor must start on a 16-byte boundary, {address:#x} does not")
    if (cols * 2) % 16:
        raise FlashbenchError(f"a TMA row stride must be a multiple of 16 bytes, {cols} fp16 is {cols * 2}")
    if not (1 <= box_cols <= 256 and 1 <= box_rows <= 256) or (box_cols * 2) % 16:
        raise FlashbenchError(f"TMA box {box} must be 1..256 per dimension with a multiple of 16 bytes innermost")
    if swizzle and box_cols * 2 > swizzle:
        raise FlashbenchError(f"a {swizzle}B-swizzled TMA box is at most {swizzle} bytes wide, {box_cols} fp16 are "
                              f"{box_cols * 2}")
    if box_cols > cols or box_rows > rows:
        raise FlashbenchError(f"TMA box {box} is larger than the [{rows}, {cols}] tensor")
    return {"data_type": DATA_TYPE_FLOAT16, "rank": 2, "address": address, "dims": (cols, rows),
            "strides": (cols * 2,), "box": (box_cols, box_rows), "element_strides": (1, 1),
            "interleave": INTERLEAVE_NONE, "swizzle": SWIZZLE[swizzle], "l2_promotion": L2_PROMOTION_128B,
            "oob_fill": OOB_FILL_NONE}


def encode_tiled_2d(address: int, rows: int, cols: int, box: tuple[int, int], swizzle: int) -> tuple[TensorMap, object]:
    """A tensor map over a row-major [rows, cols] fp16 matrix in device memory; returns (map, owner)."""
    a = tiled_2d_args(address, rows, cols, box, swizzle)
    tensor_map, owner = _aligned_tensor_map()
    dims = (ctypes.c_uint64 * 2)(*a["dims"])
    strides = (ctypes.c_uint64 * 1)(*a["strides"])
    box_dims = (ctypes.c_uint32 * 2)(*a["box"])
    element_strides = (ctypes.c_uint32 * 2)(*a["element_strides"])
    lib = libcuda()
    status = lib.cuTensorMapEncodeTiled(ctypes.addressof(tensor_map), a["data_type"], a["rank"], ctypes.c_void_p(address),
                                        dims, strides, box_dims, element_strides, a["interleave"], a["swizzle"],
                                        a["l2_promotion"], a["oob_fill"])
    if status != 0:
        message = ctypes.c_char_p()
        lib.cuGetErrorString(status, ctypes.byref(message))
        raise FlashbenchError(f"cuTensorMapEncodeTiled failed ({status}: "
                              f"{(message.value or b'unknown error').decode()}) for {a}")
    return tensor_map, owner


class Params:
    """A cuLaunchKernel parameter block: each argument as a ctypes value, and the array of pointers to
    them that kernel_params points at. Holds every value alive as long as itself."""

    def __init__(self, *values):
        self.values = values
        self.pointers = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values))

    @property
    def ptr(self) -> int:
        return ctypes.addressof(self.pointers)
