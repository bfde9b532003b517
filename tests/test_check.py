"""The correctness check's logic on CPU: NumPy stands in for CuPy, small Python implementations for kernels."""
import types

import numpy as np

from flashbench import attention
from flashbench.check import check_kernel
from flashbench.config import Shape

NUMPY_AS_CUPY = types.SimpleNamespace(
    **{name: getattr(np, name) for name in dir(np) if not name.startswith("_")},
    cuda=types.SimpleNamespace(runtime=types.SimpleNamespace(deviceSynchronize=lambda: None, CUDARuntimeError=RuntimeError),
                               driver=types.SimpleNamespace(CUDADriverError=RuntimeError)))


class Implementation:
    """Attention in fp16 by NumPy, limited to S <= max_seq_len; `mode` breaks it on purpose."""

    def __init__(self, max_seq_len=4096, mode="right"):
        self.name, self.cp, self.max_seq_len, self.mode = "numpy", NUMPY_AS_CUPY, max_seq_len, mode

    def supports(self, shape):
        return f"S={shape.S} is above its max_seq_len" if shape.S > self.max_seq_len else None

    def inputs(self, shape, rng):
        return attention.random_inputs(self.cp, shape, rng)

    def __call__(self, q, k, v, o):
        if self.mode == "unwritten":
            return o  # still NaN-poisoned
        out = attention.reference(q, k, v, np).astype(np.float16)
        if self.mode == "wrong":
            out[..., 0, :] += 1.0
        o[...] = out
        return o


SHAPES = [Shape(1, 2, 128, 128), Shape(2, 1, 256, 128)]


def check(impl):
    return check_kernel(impl, SHAPES, 1e-2, progress=lambda m: None)


def test_a_right_implementation_passes_on_fresh_inputs():
    result = check(Implementation())
    assert result["passed"] and [r["passed"] for r in result["shapes"]] == [True, True]
    assert 0 < result["shapes"][0]["rel_error"] < 1e-2
    assert result["shapes"][0]["seed"] != result["shapes"][1]["seed"]


def test_wrong_or_unwritten_output_fails():
    wrong = check(Implementation(mode="wrong"))
    assert not wrong["passed"] and "relative error" in wrong["reason"]
    unwritten = check(Implementation(mode="unwritten"))
    assert not unwritten["passed"] and "NaN/Inf elements" in unwritten["reason"]


def test_a_shape_beyond_an_implementations_limit_is_not_checked_and_does_not_fail():
    result = check(Implementation(max_seq_len=128))
    assert result["passed"]
    assert result["shapes"][1]["passed"] is None and result["shapes"][1]["reason"].startswith("not checked: S=256")
    assert not check(Implementation(max_seq_len=64))["passed"]  # nothing checked at all is no pass
