"""The correctness check on CPU: NumPy stands in for CuPy, small Python implementations for kernels,
and planted defects must fail at the small shapes and at the write-up's case."""
import math
import statistics
import types

import numpy as np
import pytest

from flashbench import NoKernelForShape, attention, elements
from flashbench.check import Gate, check_kernel, check_shape
from flashbench.config import Shape

def _event(done: bool):
    """A CUDA event as the check polls it: recorded after a call, done once the call has finished."""
    return lambda disable_timing=False: types.SimpleNamespace(record=lambda: None, done=done)


NUMPY_AS_CUPY = types.SimpleNamespace(
    **{name: getattr(np, name) for name in dir(np) if not name.startswith("_")},
    cuda=types.SimpleNamespace(Event=_event(done=True),
                               runtime=types.SimpleNamespace(deviceSynchronize=lambda: None, CUDARuntimeError=RuntimeError),
                               driver=types.SimpleNamespace(CUDADriverError=RuntimeError)))
GATE = Gate(factor=2.0, tolerance=5e-3)
BLOCK = 64  # the rows of one block, and the keys of one key tile, of the implementations below


def flash_like(q, k, v, scale=None, key_tiles_skipped=0, causal=False):
    """Attention as the kernels compute it, in the inputs' element type (fp16, or bf16 as elements holds it):
    fp32 logits, exp2 with a running maximum per key tile, P rounded to the element type before PV, one
    normalisation at the end, rounded out; the keys after each query masked where `causal`; K and V of q's
    heads. `key_tiles_skipped`: leave out the last key tiles (a planted defect)."""
    dtype = elements.of_array(q)
    q, k, v = (elements.to_float32(a, np) for a in (q, k, v))
    S, D = k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    logits = np.matmul(q, k.swapaxes(-1, -2)) * np.float32(scale * attention.LOG2E)
    if causal:
        logits = np.where(np.tri(q.shape[-2], S, dtype=bool), logits, np.float32(-np.inf))
    m = np.full(q.shape[:-1] + (1,), -np.inf, np.float32)
    l, o = np.zeros_like(m), np.zeros(q.shape, np.float32)
    for j in range(0, S - BLOCK * key_tiles_skipped, BLOCK):
        tile = logits[..., j:j + BLOCK]
        m_new = np.maximum(m, tile.max(-1, keepdims=True))
        p, alpha = np.exp2(tile - m_new), np.exp2(m - m_new)
        l = l * alpha + p.sum(-1, keepdims=True)
        o = o * alpha + elements.rounded(p, dtype, np) @ v[..., j:j + BLOCK, :]
        m = m_new
    with np.errstate(invalid="ignore"):  # every key tile skipped (S = one tile): 0 / 0, NaN, the check's to fail
        return elements.from_float32(o / l, dtype, np)


class Implementation:
    """A flash-like NumPy kernel on inputs of `dtype`, its K and V of H / kv_group heads; `defect` plants one
    bug: zero_row, missing_key_tile (one block of one head never sees its last key tile), scale (1% too
    large), unwritten_tile (one block left as the check handed the output over), wrong_kv_head (query head h
    reads K/V head h mod H_kv, not h // kv_group)."""

    skips_unsupported = False
    smallest_seq_len = BLOCK

    def __init__(self, defect=None, max_seq_len=None, name="numpy", causal=False, dtype="fp16", kv_group=1):
        self.name, self.cp, self.defect, self.max_seq_len, self.causal = name, NUMPY_AS_CUPY, defect, max_seq_len, causal
        self.dtype, self.kv_group = dtype, kv_group

    def supports(self, shape):
        if self.max_seq_len and shape.S > self.max_seq_len:
            return f"S={shape.S} is above its max_seq_len"
        return None if shape.S % BLOCK == 0 else f"S={shape.S} is not a multiple of {BLOCK}"

    def inputs(self, shape, rng, kind="normal"):
        return attention.random_inputs(self.cp, shape, rng, kind, dtype=self.dtype, kv_heads=shape.H // self.kv_group)

    def __call__(self, q, k, v, o):
        handed = o.copy()
        scale = 1.01 / math.sqrt(q.shape[-1]) if self.defect == "scale" else None
        H, H_kv = q.shape[1], k.shape[1]
        heads = np.arange(H) % H_kv if self.defect == "wrong_kv_head" else np.arange(H) // (H // H_kv)
        o[...] = flash_like(q, k[:, heads], v[:, heads], scale, causal=self.causal)
        plant(self.defect, q, k[:, heads], v[:, heads], o, handed)
        return o


def plant(defect, q, k, v, o, handed):
    """Plant one bug into a correct output `o` (in place; k and v of q's heads); the place is the middle head,
    second block. `handed`: the output as the check handed it over, before the kernel wrote it."""
    B, H, S, D = q.shape
    h, rows = H // 2, slice(BLOCK, 2 * BLOCK) if S >= 2 * BLOCK else slice(0, BLOCK)
    if defect == "zero_row":
        o[0, h, rows.start + 3] = 0
    elif defect == "missing_key_tile":
        o[0, h, rows] = flash_like(q[0, h, rows], k[0, h], v[0, h], key_tiles_skipped=1)
    elif defect == "unwritten_tile":
        o[0, h, rows] = handed[0, h, rows]


DEFECTS = ("zero_row", "missing_key_tile", "scale", "unwritten_tile")
SMALL = [Shape(1, 3, 128, 128), Shape(3, 5, 64, 128)]


def test_a_right_implementation_passes_every_input_kind_on_fresh_inputs():
    result = check_kernel(Implementation(), SMALL, GATE, progress=lambda m: None)
    assert result["passed"], result["reason"]
    assert len(result["shapes"]) == len(SMALL) * len(attention.INPUT_KINDS)
    assert {r["inputs"] for r in result["shapes"]} == set(attention.INPUT_KINDS)
    for r in result["shapes"]:
        assert 0 < r["margin"] < 0.6 and r["worst_row_rel_error"] > 0  # well inside its bounds
    # closer than plain fp16 on most inputs; on some (one key repeated) both round alike, within an ulp
    assert statistics.median(r["max_abs_error"] / r["yardstick_max_abs_error"] for r in result["shapes"]) < 0.5
    assert len({r["seed"] for r in result["shapes"]}) == len(result["shapes"])


def test_under_the_causal_mask_the_masked_reference_judges_and_the_mask_must_match():
    result = check_kernel(Implementation(causal=True), SMALL, GATE, progress=lambda m: None, causal=True)
    assert result["passed"], result["reason"]
    planted = check_kernel(Implementation("zero_row", causal=True), SMALL, GATE, kinds=["normal"],
                           progress=lambda m: None, causal=True)
    assert not planted["passed"] and "plain fp16" in planted["reason"]
    for impl, causal, says in ((Implementation(causal=True), False, "under the causal mask, asked without"),
                               (Implementation(), True, "without the causal mask, asked with")):
        wrong = check_kernel(impl, SMALL[:1], GATE, kinds=["normal"], progress=lambda m: None, causal=causal)
        assert not wrong["passed"] and says in wrong["reason"]


@pytest.mark.parametrize("defect", DEFECTS)
def test_a_planted_defect_fails_at_the_small_shapes(defect):
    for shape in SMALL:
        result = check_kernel(Implementation(defect), [shape], GATE, kinds=["normal"], progress=lambda m: None)
        assert not result["passed"], (defect, shape, result["shapes"])
        reason = result["reason"]  # a block with no key tile left divides 0 by 0: NaN
        assert "NaN/Inf" in reason or (defect != "unwritten_tile" and "plain fp16" in reason), reason


GROUPED = [Shape(1, 4, 128, 128), Shape(3, 6, 64, 128)]  # heads that 1, 2 and all K/V heads divide


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("kv_group", [1, 2, "all"])  # full heads, GQA, MQA
def test_in_each_element_type_and_on_grouped_k_v_heads_the_right_output_passes_and_a_planted_defect_fails(
        dtype, kv_group):
    for shape in GROUPED:
        group = shape.H if kv_group == "all" else kv_group
        right = check_kernel(Implementation(dtype=dtype, kv_group=group), [shape], GATE, progress=lambda m: None)
        assert right["passed"], right["reason"]
        assert all(r.get("H_kv", shape.H) == shape.H // group for r in right["shapes"])
        assert all(0 < r["margin"] < 0.6 for r in right["shapes"])  # well inside the bounds of its own type
        # (with one K/V head, or one query head a K/V head, every mapping of heads is the right one)
        wrong_head = ["wrong_kv_head"] if 1 < group < shape.H else []
        for defect in ["zero_row", "missing_key_tile", "unwritten_tile", *wrong_head]:
            planted = check_kernel(Implementation(defect, dtype=dtype, kv_group=group), [shape], GATE,
                                   kinds=["normal"], progress=lambda m: None)
            assert not planted["passed"], (dtype, group, shape, defect)
            reason = planted["reason"]  # a block with no key tile left (S=64) divides 0 by 0: NaN
            assert "NaN/Inf" in reason or (defect != "unwritten_tile" and f"plain {dtype}" in reason), reason


def test_bf16_rounds_to_nearest_ties_to_even_and_keeps_nan_and_infinity():
    values = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-8 + 2**-20, -(1 + 2**-8), 2.0**-133, np.inf, -np.inf,
                       np.nan, 3.4e38], dtype=np.float32)
    bits = elements.from_float32(values, "bf16", np)
    # 1 + 2^-8 lies half-way between 1 (0x3F80, even) and 1 + 2^-7 (0x3F81): to 1; 1 + 3 * 2^-8 half-way between
    # 0x3F81 and 0x3F82 (even): up; just past half-way: up; a subnormal kept; 3.4e38, past half-way from bf16's largest: infinity
    assert [hex(b) for b in bits] == ["0x3f80", "0x3f80", "0x3f82", "0x3f81", "0xbf80", "0x1", "0x7f80", "0xff80",
                                      "0x7fc0", "0x7f80"]
    back = elements.to_float32(bits, np)
    assert back[:6].tolist() == [1.0, 1.0, 1 + 2**-6, 1 + 2**-7, -1.0, 2.0**-133] and np.isnan(back[8])
    assert elements.of_array(bits) == "bf16" and elements.rounded(np.float32([1 + 2**-8]), "fp16", np)[0] == 1 + 2**-8


def test_the_thresholds_are_the_gates_formula_worked_by_hand():
    yardstick = {"max_abs_error": 1e-3, "worst_row_rel_error": 2e-3, "rel_error": 1e-3}
    # fp16: factor x plain fp16's error + half an fp16 ulp (2^-11, times the reference's largest value for the
    # absolute error); the whole-tensor error capped at the tolerance
    assert GATE.thresholds(yardstick, ref_max_abs=4.0) == pytest.approx(
        {"max_abs_error": 2e-3 + 4 * 2**-11, "worst_row_rel_error": 4e-3 + 2**-11, "rel_error": 2e-3 + 2**-11})
    assert GATE.thresholds({**yardstick, "rel_error": 4e-3}, 4.0)["rel_error"] == pytest.approx(5e-3)  # the cap
    # bf16: half a bf16 ulp (2^-8), and the cap scaled by it (8 x 5e-3)
    assert GATE.thresholds(yardstick, 4.0, "bf16") == pytest.approx(
        {"max_abs_error": 2e-3 + 4 * 2**-8, "worst_row_rel_error": 4e-3 + 2**-8, "rel_error": 2e-3 + 2**-8})
    assert GATE.thresholds({**yardstick, "rel_error": 0.03}, 4.0, "bf16")["rel_error"] == pytest.approx(0.04)


# The case's reference and yardstick are worked out a head at a time (max_logit_bytes): the same
# values as all 64 heads at once (each head is its own product), without the 256 MB temporaries that
# make NumPy take twice as long.
ONE_HEAD_AT_THE_CASE = 1024 * 1024 * 4


@pytest.fixture(scope="module")
def at_the_case():
    """The write-up's case on normal inputs: its reference, yardstick and a correct output (the
    reference rounded to fp16: flash_like at this size is slow in NumPy), once."""
    shape = Shape(1, 64, 1024, 128)
    q, k, v, _ = attention.random_inputs(np, shape, np.random.default_rng(7))
    ref = attention.reference(q, k, v, np, max_logit_bytes=ONE_HEAD_AT_THE_CASE)
    yardstick = attention.errors(attention.plain_code(q, k, v, np, max_logit_bytes=ONE_HEAD_AT_THE_CASE), ref, np)
    return q, k, v, ref, yardstick, ref.astype(np.float16)


def judge(out, ref, yardstick):
    return GATE.judge(attention.errors(out, ref, np), yardstick, float(np.abs(ref).max()))


@pytest.mark.parametrize("defect", DEFECTS)
def test_a_planted_defect_fails_at_the_writeups_case(at_the_case, defect):
    q, k, v, ref, yardstick, good = at_the_case
    if defect == "scale":  # the fp32 reference of logits 1% too large, rounded to fp16
        out = attention.reference(q.astype(np.float32) * 1.01, k, v, np, max_logit_bytes=ONE_HEAD_AT_THE_CASE)
        out = out.astype(np.float16)
    else:
        out = good.copy()
        plant(defect, q, k, v, out, attention.poisoned_output(np, Shape(*q.shape)))
    verdict = judge(out, ref, yardstick)
    assert not verdict["passed"], verdict
    if defect != "unwritten_tile":
        assert verdict["margin"] > 2  # not a near miss: the gate sees it plainly


def test_the_right_output_passes_at_the_writeups_case(at_the_case):
    q, k, v, ref, yardstick, good = at_the_case
    verdict = judge(good, ref, yardstick)
    assert verdict["passed"] and verdict["margin"] < 0.5, verdict


@pytest.mark.parametrize("metric", ["max_abs_error", "worst_row_rel_error", "rel_error"])
def test_an_error_just_over_a_threshold_fails_and_just_under_passes(metric):
    yardstick = {"max_abs_error": 1e-3, "worst_row_rel_error": 2e-3, "rel_error": 7e-4, "nonfinite": 0}
    thresholds = GATE.thresholds(yardstick, ref_max_abs=0.5)
    calm = {m: 0.1 * t for m, t in thresholds.items()} | {"nonfinite": 0}
    assert not GATE.judge(calm | {metric: thresholds[metric] * 1.001}, yardstick, 0.5)["passed"]
    assert GATE.judge(calm | {metric: thresholds[metric] * 0.999}, yardstick, 0.5)["passed"]


def test_one_row_just_over_its_bound_fails_end_to_end(at_the_case):
    q, k, v, ref, yardstick, good = at_the_case
    good = good.astype(np.float32)
    bound = GATE.thresholds(yardstick, float(np.abs(ref).max()))["worst_row_rel_error"]
    row = ref[0, 11, 500]
    direction = np.random.default_rng(1).standard_normal(128).astype(np.float32)
    direction *= np.linalg.norm(row) / np.linalg.norm(direction)
    for size, passes in ((1.05, False), (0.9, True)):  # relative error of that row: size x its bound
        out = good.copy()
        out[0, 11, 500] = row + size * bound * direction
        assert judge(out, ref, yardstick)["passed"] is passes, size


def test_nan_anywhere_fails():
    ref = np.ones((1, 1, 4, 128), dtype=np.float32)
    out = ref.copy()
    out[0, 0, 2, 5] = np.nan
    verdict = GATE.judge(attention.errors(out, ref, np), attention.errors(ref, ref, np), 1.0)
    assert not verdict["passed"] and "1 NaN/Inf" in verdict["reason"]


class WritesIntoItsInputs(Implementation):
    """Correct on what it leaves in Q, K, V, which it changes first: `change` does it in place."""

    def __init__(self, change):
        super().__init__()
        self.change = change

    def __call__(self, q, k, v, o):
        self.change(q, k, v)
        return super().__call__(q, k, v, o)


def scale_q(q, k, v):
    q[...] = q * np.float16(1.05)  # a 5% scale error, hidden in the inputs


def zero_last_keys_of_v(q, k, v):
    v[..., -32:, :] = 0


@pytest.mark.parametrize("change, changed", [(scale_q, "Q"), (zero_last_keys_of_v, "V")])
def test_a_kernel_that_changes_its_inputs_fails_and_is_judged_on_the_inputs_it_was_given(change, changed):
    result = check_kernel(WritesIntoItsInputs(change), [SMALL[0]], GATE, kinds=["normal"], progress=lambda m: None)
    assert not result["passed"]
    (row,) = result["shapes"]
    assert row["reason"].startswith(f"the kernel changed its inputs ({changed}); ") and "above" in row["reason"]
    assert row["margin"] > 2  # against the inputs it was given the output is plainly wrong


class ZeroV(Implementation):
    """Inputs with V all zero: the reference is all zero, and so is a right output."""

    def __init__(self, stray=0.0):
        super().__init__()
        self.stray = stray

    def inputs(self, shape, rng, kind="normal"):
        q, k, v, o = super().inputs(shape, rng, kind)
        return q, k, np.zeros_like(v), o

    def __call__(self, q, k, v, o):
        super().__call__(q, k, v, o)
        o[0, 0, 0, 0] = self.stray
        return o


def test_an_all_zero_reference_is_judged_without_dividing_by_zero():
    right = check_shape(ZeroV(), SMALL[0], GATE, seed=1)
    assert right["passed"] and right["margin"] == 0 and right["rel_error"] == 0
    stray = check_shape(ZeroV(stray=1e-3), SMALL[0], GATE, seed=1)
    assert not stray["passed"] and stray["margin"] == math.inf
    assert "max abs error 1.00e-03 above 0.00e+00" in stray["reason"]


@pytest.mark.parametrize("factor, tolerance", [(float("nan"), 5e-3), (2.0, float("inf")), (0.0, 5e-3)])
def test_a_gate_needs_positive_finite_bounds(factor, tolerance):
    from flashbench import FlashbenchError
    with pytest.raises(FlashbenchError, match="must be a positive finite number, not"):
        Gate(factor=factor, tolerance=tolerance)


def test_the_reference_works_out_its_own_scale_from_d():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 64, 64)).astype(np.float16) for _ in range(3))
    logits = q.astype(np.float64) @ k.astype(np.float64).swapaxes(-1, -2) / 8.0  # 1/sqrt(64)
    p = np.exp(logits - logits.max(-1, keepdims=True))
    expected = (p / p.sum(-1, keepdims=True)) @ v.astype(np.float64)
    assert np.abs(attention.reference(q, k, v, np) - expected).max() < 1e-5


def test_a_kernel_must_run_every_configured_shape_a_peer_may_skip_one_but_not_the_case():
    case_first = [SMALL[1], SMALL[0]]  # S=64 (the case here), then S=128
    kernel = check_kernel(Implementation(max_seq_len=64), case_first, GATE, kinds=["normal"], progress=lambda m: None)
    assert not kernel["passed"] and "a configured shape it cannot run" in kernel["reason"]
    peer = Implementation(max_seq_len=64, name="peer")
    peer.skips_unsupported = True
    result = check_kernel(peer, case_first, GATE, kinds=["normal"], progress=lambda m: None)
    assert result["passed"] and result["shapes"][1]["reason"].startswith("not checked: S=128")
    at_the_case = check_kernel(peer, SMALL, GATE, kinds=["normal"], progress=lambda m: None)  # S=128 first
    assert not at_the_case["passed"] and at_the_case["reason"].startswith("B=1 H=3 S=128 normal: not checked: S=128")


def test_no_kernel_for_a_shape_is_a_skip_anything_else_stops_the_check():
    class NoKernel(Implementation):
        def __call__(self, q, k, v, o):
            raise NoKernelForShape("torch has no cudnn kernel for these inputs")

    skipped = check_shape(NoKernel(), SMALL[0], GATE, seed=1)
    assert skipped["passed"] is None and skipped["reason"].startswith("not checked: torch has no")

    class OutOfMemory(Implementation):
        def __call__(self, q, k, v, o):
            from flashbench import FlashbenchError
            raise FlashbenchError("torch failed running sdpa_cudnn: CUDA out of memory")

    from flashbench import FlashbenchError
    with pytest.raises(FlashbenchError, match="out of memory"):
        check_shape(OutOfMemory(), SMALL[0], GATE, seed=1)


def test_a_call_that_never_finishes_fails_its_check_by_the_deadline_and_ends_it(monkeypatch):
    """A kernel that hangs (its event never done, as a barrier nothing arrives at leaves it): the check does
    not wait on it for ever, but fails it as hung once the deadline passes, and calls it no more."""
    import time

    from flashbench import check

    class Hangs(Implementation):
        def __init__(self):
            super().__init__(name="hangs")
            self.calls = 0
            self.cp = types.SimpleNamespace(**{**vars(NUMPY_AS_CUPY), "cuda": types.SimpleNamespace(
                **{**vars(NUMPY_AS_CUPY.cuda), "Event": _event(done=False)})})

        def __call__(self, q, k, v, o):
            self.calls += 1
            return o

    monkeypatch.setattr(check, "HANG_AFTER_S", 0.05)
    started = time.monotonic()
    result = check_shape(Hangs(), SMALL[0], GATE, seed=1)
    assert 0.05 <= time.monotonic() - started < 5
    assert result["passed"] is False and result["fatal"] and result["hung"]
    assert result["reason"] == "the call had not finished after 0.05 s: it hangs"
    hangs = Hangs()
    stopped = check_kernel(hangs, SMALL, GATE, progress=lambda m: None)
    assert hangs.calls == 1 and len(stopped["shapes"]) == 1 and not stopped["passed"]
    assert stopped["reason"] == "B=1 H=3 S=128 normal: the call had not finished after 0.05 s: it hangs"


def test_each_kernel_is_also_checked_at_its_smallest_s_with_an_odd_head_count():
    result = check_kernel(Implementation(), [Shape(1, 2, 128, 128)], GATE, kinds=["normal"], smallest=(3, 5),
                          progress=lambda m: None)
    assert [(r["B"], r["H"], r["S"]) for r in result["shapes"]] == [(1, 2, 128), (3, 5, BLOCK)]


class AnySeqLen(Implementation):
    """An implementation that takes any S (its last tile a part), as a kernel by head does."""

    def supports(self, shape):
        return None


def test_a_ragged_s_is_checked_by_what_takes_it_and_a_defect_there_fails():
    ragged, shapes = (Shape(1, 3, 200, 128), Shape(1, 3, 150, 128)), [Shape(1, 2, 128, 128)]
    taken = check_kernel(AnySeqLen(), shapes, GATE, kinds=["normal"], ragged=ragged, progress=lambda m: None)
    assert [(r["S"], r["passed"]) for r in taken["shapes"]] == [(128, True), (200, True), (150, True)]
    assert taken["passed"]
    tiled = check_kernel(Implementation(), shapes, GATE, kinds=["normal"], ragged=ragged, progress=lambda m: None)
    assert [r["S"] for r in tiled["shapes"]] == [128] and tiled["passed"]  # its tiles must divide S: not asked
    planted = check_kernel(AnySeqLen("zero_row"), shapes, GATE, kinds=["normal"], ragged=ragged, progress=lambda m: None)
    assert [r["passed"] for r in planted["shapes"] if r["S"] == 200] == [False] and not planted["passed"]


def _late_jump_log2(kind: str) -> np.ndarray:
    """Per row: how far the last keys' largest logit lies above the earlier keys' largest, in the log2
    units the kernels take exp2 in (scale 1/sqrt(D) times log2 e)."""
    shape = Shape(1, 2, 512, 128)
    q, k, _, _ = attention.random_inputs(np, shape, np.random.default_rng(5), kind)
    logits = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float32), k.astype(np.float32))
    logits *= attention.softmax_scale(shape.D) * math.log2(math.e)
    late = logits[..., -attention.LATE_KEYS:].max(-1)
    return late - logits[..., :-attention.LATE_KEYS].max(-1)


def test_far_max_makes_exp_against_an_earlier_maximum_overflow():
    """far_max is there for kernels that take exp before the max (V23): against the earlier keys' max,
    2^x of the late keys overflows fp32 (x >= 128) in almost every row, so in every warp's 16 rows;
    late_max moves most rows' maximum by more than V22's 2^8 and stays inside fp32."""
    far, late = _late_jump_log2("far_max"), _late_jump_log2("late_max")
    assert (far > 128).mean() > 0.95 and (far.reshape(-1, 16) > 128).any(axis=1).all()
    assert (late > 8).mean() > 0.5 and late.max() < 128
