"""The case's arithmetic (the write-up's formulas) and the fp32 reference attention."""
from __future__ import annotations

import math

from .config import Shape

SCALE = 1.0 / math.sqrt(128)
LOG2E = math.log2(math.e)
FP16_NAN_BITS = 0x7E00  # poison: an element the kernel does not write stays NaN and fails


def flops(shape: Shape) -> int:
    """Two matmuls, softmax not counted: 4 * B * H * S^2 * D (34.36 GFLOP for the case)."""
    return 4 * shape.B * shape.H * shape.S**2 * shape.D


def tflops(shape: Shape, seconds: float) -> float:
    return flops(shape) / seconds / 1e12


def qkvo_bytes(shape: Shape) -> int:
    """Bytes of Q, K, V and O in fp16: the write-up's memory-throughput numerator."""
    return 4 * shape.B * shape.H * shape.S * shape.D * 2


def gib_per_s(shape: Shape, seconds: float) -> float:
    return qkvo_bytes(shape) / seconds / 2**30


def input_bytes(shape: Shape) -> int:
    """Q, K and V in fp16: what a repeated call reads again."""
    return 3 * shape.B * shape.H * shape.S * shape.D * 2


def random_inputs(cp, shape: Shape, rng) -> tuple:
    """Fresh random Q, K, V (normal, fp16) and a NaN-poisoned O, all [B, H, S, D], on the GPU."""
    dims = (shape.B, shape.H, shape.S, shape.D)
    q, k, v = (rng.standard_normal(dims, dtype=cp.float32).astype(cp.float16) for _ in range(3))
    return q, k, v, poisoned_output(cp, shape)


def poisoned_output(cp, shape: Shape):
    return cp.full((shape.B, shape.H, shape.S, shape.D), FP16_NAN_BITS, dtype=cp.uint16).view(cp.float16)


def reference(q, k, v, xp, max_logit_bytes: int = 1 << 30):
    """softmax(Q K^T / sqrt(D)) V in fp32 for [B, H, S, D] arrays of numpy or cupy (`xp`)."""
    B, H, S, D = q.shape
    out = xp.empty((B, H, S, D), dtype=xp.float32)
    q3, k3, v3, o3 = (a.reshape(B * H, S, D) for a in (q, k, v, out))
    heads = max(1, max_logit_bytes // (S * S * 4))
    for h0 in range(0, B * H, heads):
        sl = slice(h0, h0 + heads)
        logits = xp.matmul(q3[sl].astype(xp.float32), k3[sl].astype(xp.float32).transpose(0, 2, 1)) * SCALE
        logits -= logits.max(axis=-1, keepdims=True)
        p = xp.exp(logits)
        p /= p.sum(axis=-1, keepdims=True)
        o3[sl] = xp.matmul(p, v3[sl].astype(xp.float32))
    return out


def errors(out, ref, xp) -> dict:
    """Relative error ||out - ref|| / ||ref|| (fp64 sums), max abs error and NaN/Inf count."""
    diff = out.astype(xp.float64) - ref.astype(xp.float64)
    nonfinite = int((~xp.isfinite(out)).sum())
    rel = float(xp.linalg.norm(diff.ravel()) / xp.linalg.norm(ref.astype(xp.float64).ravel()))
    return {
        "rel_error": rel if nonfinite == 0 else float("nan"),
        "max_abs_error": float(xp.abs(diff).max()) if nonfinite == 0 else float("nan"),
        "nonfinite": nonfinite,
    }
