"""The case's arithmetic (the write-up's formulas), the check's inputs, the fp32 reference and the
plain-code yardstick (plain fp16 or bf16) the check measures a kernel's error against.

Inputs are fp16 or bf16 (elements.py: bf16 as uint16 bit patterns). Q has H heads; K and V have H or,
with grouped K/V heads, fewer, each read by H / H_kv consecutive query heads (query head h by K/V head
h // (H / H_kv), as SDPA's enable_gqa and FlashAttention take them)."""
from __future__ import annotations

import math

from . import elements
from .config import Shape

LOG2E = math.log2(math.e)

# The inputs the check runs every shape on. Normal values are the write-up's; the others make the
# online softmax work: late_max makes every earlier partial sum be rescaled by ~e^-10, far_max makes
# exp against an earlier maximum overflow (for kernels that take exp before the max), equal_logits
# weighs every key the same (the output is the mean of V). What each kind is, in a report's words:
INPUT_KINDS = ("normal", "large_logits", "late_max", "far_max", "equal_logits")
INPUT_KIND_TEXT = {
    "normal": "normal values",
    "large_logits": "Q and K scaled by √6 for a logit spread six times wider",
    "late_max": "each row's maximum only in the last 64 keys",
    "far_max": "each row's maximum only in the last 64 keys and about 150 (log2) above the rest, so that exp against an earlier maximum overflows fp32",
    "equal_logits": "all logits of a row equal",
}
LATE_KEYS = 64  # the late maximum sits in the last 64 keys: inside the last key tile of every kernel
LEAN = {"late_max": 3.0, "far_max": 30.0}  # how far every query leans towards the late keys


def softmax_scale(D: int) -> float:
    """1/sqrt(D), what the kernels and peers are given (the reference works its own out)."""
    return 1.0 / math.sqrt(D)


def flops(shape: Shape, causal: bool = False) -> int:
    """Two matmuls, softmax not counted: 4 * B * H * S^2 * D (34.36 GFLOP for the case); under the
    causal mask half of it, 2 * B * H * S^2 * D, as FlashAttention's benchmarks count it."""
    return (2 if causal else 4) * shape.B * shape.H * shape.S**2 * shape.D


def tflops(shape: Shape, seconds: float, causal: bool = False) -> float:
    return flops(shape, causal) / seconds / 1e12


def qkvo_bytes(shape: Shape) -> int:
    """Bytes of Q, K, V and O of H heads in a 2-byte type: the write-up's memory-throughput numerator. On
    grouped K/V heads the bytes an ungrouped call would move (the figure compares calls of one shape;
    the K and V read are H_kv / H of theirs)."""
    return 4 * shape.B * shape.H * shape.S * shape.D * 2


def gib_per_s(shape: Shape, seconds: float) -> float:
    return qkvo_bytes(shape) / seconds / 2**30


def input_bytes(shape: Shape) -> int:
    """Q, K and V in fp16: what a repeated call reads again."""
    return 3 * shape.B * shape.H * shape.S * shape.D * 2


def random_inputs(cp, shape: Shape, rng, kind: str = "normal", dtype: str = "fp16", kv_heads: int | None = None
                  ) -> tuple:
    """Fresh random Q, K, V of `dtype` (fp16, bf16) of one of INPUT_KINDS and a NaN-poisoned O: Q and O
    [B, H, S, D], K and V [B, kv_heads, S, D] (H unless given)."""
    kv_dims = (shape.B, kv_heads or shape.H, shape.S, shape.D)
    q = rng.standard_normal((shape.B, shape.H, shape.S, shape.D), dtype=cp.float32)
    k, v = (rng.standard_normal(kv_dims, dtype=cp.float32) for _ in range(2))
    if kind == "large_logits":
        q *= math.sqrt(6.0)
        k *= math.sqrt(6.0)
    elif kind in LEAN:
        # Every query leans along one direction u (q.u ~ LEAN +- 1), the last keys are 40 u: their
        # logits are ~10 (late_max) or ~110 (far_max, ~150 in log2 units) above the rest for almost
        # every row.
        u = cp.full(shape.D, 1.0 / math.sqrt(shape.D), dtype=cp.float32)
        q += LEAN[kind] * u
        k[:, :, -LATE_KEYS:, :] = 40.0 * u + 0.1 * k[:, :, -LATE_KEYS:, :]
    elif kind == "equal_logits":
        k[:] = k[:, :, :1, :]  # one key repeated: q.k is the same for every key of a row
    elif kind != "normal":
        raise ValueError(f"unknown input kind {kind!r} (one of {', '.join(INPUT_KINDS)})")
    return (*(elements.from_float32(a, dtype, cp) for a in (q, k, v)), poisoned_output(cp, shape, dtype))


def poisoned_output(cp, shape: Shape, dtype: str = "fp16"):
    """[B, H, S, D] of `dtype`'s NaN: an element the kernel does not write stays NaN and fails."""
    return elements.nan_filled(cp, (shape.B, shape.H, shape.S, shape.D), dtype)


def _grouped(q, k, xp):
    """K (or V) with each K/V head repeated for the query heads that read it: as many heads as q."""
    group = q.shape[1] // k.shape[1]
    if group * k.shape[1] != q.shape[1]:
        raise ValueError(f"{q.shape[1]} query heads do not share {k.shape[1]} K/V heads evenly")
    return xp.repeat(k, group, axis=1) if group > 1 else k


def _head_chunks(B: int, H: int, S: int, max_logit_bytes: int):
    heads = max(1, max_logit_bytes // (S * S * 4))
    return (slice(h0, h0 + heads) for h0 in range(0, B * H, heads))


def _masked(logits, xp, causal: bool):
    """The logits [heads, S, S] with every key after its query at -inf where `causal`."""
    if causal:
        S = logits.shape[-1]
        logits = xp.where(xp.tri(S, dtype=bool), logits, logits.dtype.type(-xp.inf))
    return logits


def _softmax_rows(logits, xp):
    logits = logits - logits.max(axis=-1, keepdims=True)
    p = xp.exp(logits)
    return p / p.sum(axis=-1, keepdims=True)


def reference(q, k, v, xp, causal: bool = False, max_logit_bytes: int = 1 << 30):
    """softmax(Q K^T / sqrt(D)) V in fp32 for [B, H, S, D] arrays of numpy or cupy (`xp`) of fp16 or bf16
    (K and V of H or fewer heads), under the causal mask (key j seen by query i for j <= i only) where
    `causal`. The scale is worked out here from D, not shared with what the kernels are given."""
    B, H, S, D = q.shape
    out = xp.empty((B, H, S, D), dtype=xp.float32)
    k, v = _grouped(q, k, xp), _grouped(q, v, xp)
    q3, k3, v3, o3 = (a.reshape(B * H, S, D) for a in (q, k, v, out))
    for sl in _head_chunks(B, H, S, max_logit_bytes):
        q32, k32, v32 = (elements.to_float32(a[sl], xp) for a in (q3, k3, v3))
        logits = xp.matmul(q32, k32.transpose(0, 2, 1)) / math.sqrt(D)
        o3[sl] = xp.matmul(_softmax_rows(_masked(logits, xp, causal), xp), v32)
    return out


def plain_code(q, k, v, xp, causal: bool = False, max_logit_bytes: int = 1 << 30):
    """The yardstick: attention as plain code computes it in the inputs' element type (unfused PyTorch in
    half precision, fp16 or bf16): each product accumulated in fp32 and stored in that type (logits,
    scaled logits, softmax, output), the mask applied to the scaled logits where `causal`."""
    B, H, S, D = q.shape
    dtype, f32 = elements.of_array(q), xp.float32
    out = xp.empty((B, H, S, D), dtype=elements.storage(xp, dtype))
    k, v = _grouped(q, k, xp), _grouped(q, v, xp)
    q3, k3, v3, o3 = (a.reshape(B * H, S, D) for a in (q, k, v, out))
    scale = elements.rounded(xp.asarray([1.0 / math.sqrt(D)], dtype=f32), dtype, xp)[0]
    for sl in _head_chunks(B, H, S, max_logit_bytes):
        q32, k32, v32 = (elements.to_float32(a[sl], xp) for a in (q3, k3, v3))
        logits = elements.rounded(xp.matmul(q32, k32.transpose(0, 2, 1)), dtype, xp)
        logits = elements.rounded(logits * scale, dtype, xp)
        p = elements.rounded(_softmax_rows(_masked(logits, xp, causal), xp), dtype, xp)
        o3[sl] = elements.from_float32(xp.matmul(p, v32), dtype, xp)
    return out


TINY_NORM = 1e-30  # what a relative error divides by where the reference is all zero (a row, or all of it)


def errors(out, ref, xp) -> dict:
    """Against the fp32 reference: whole-tensor relative error ||out - ref|| / ||ref||, the worst
    row's relative error (a row: one query's D outputs), the max abs error (fp64 sums), and the
    count of NaN/Inf elements (any one fails: the errors are then NaN). A reference norm of 0 counts
    as TINY_NORM: an exact output has no relative error there, any other a huge one."""
    ref64 = ref.astype(xp.float64)
    out = elements.to_float32(out, xp)
    diff = out.astype(xp.float64) - ref64
    nonfinite = int((~xp.isfinite(out)).sum())
    if nonfinite:
        nan = float("nan")
        return {"rel_error": nan, "worst_row_rel_error": nan, "max_abs_error": nan, "nonfinite": nonfinite}
    row_ref = xp.sqrt((ref64 * ref64).sum(axis=-1))
    row_rel = xp.sqrt((diff * diff).sum(axis=-1)) / xp.maximum(row_ref, TINY_NORM)
    return {
        "rel_error": float(xp.linalg.norm(diff.ravel()) / max(float(xp.linalg.norm(ref64.ravel())), TINY_NORM)),
        "worst_row_rel_error": float(row_rel.max()),
        "max_abs_error": float(xp.abs(diff).max()),
        "nonfinite": 0,
    }
