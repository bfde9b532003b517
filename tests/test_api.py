"""flashbench.flash_attention: its refusals (no GPU, no torch: stand-in tensors), and on a GPU with torch,
against SDPA in both layouts, with and without the mask, at ragged S; no input copied where the kernel
reads it as it lies; captured in a CUDA graph."""
import collections
import hashlib
import os
import shutil
import subprocess
import sys
import warnings

import pytest

import flashbench
from flashbench import FlashbenchError, api


Device = collections.namedtuple("Device", "type index")


class Stand:
    """What flash_attention reads of a torch tensor: shape, dtype, device, strides, address."""

    def __init__(self, shape, dtype="torch.float16", device="cuda", strides=None, address=0x7F0000000000,
                 requires_grad=False):
        self.shape, self.dtype, self.requires_grad = tuple(shape), dtype, requires_grad
        self.device = Device(device, 0 if device == "cuda" else None)
        contiguous = [1]
        for n in reversed(self.shape[1:]):
            contiguous.insert(0, contiguous[0] * n)
        self._strides, self._address = tuple(strides or contiguous), address

    def stride(self, dim=None):
        return self._strides if dim is None else self._strides[dim]

    def data_ptr(self):
        return self._address


BSHD = (2, 1000, 3, 128)


def call(q, k=None, v=None, **kw):
    return flashbench.flash_attention(q, k if k is not None else q, v if v is not None else q, **kw)


@pytest.mark.parametrize("inputs, kw, message", [
    ((Stand(BSHD),), {"layout": "sbhd"}, "layout 'sbhd' is not one of 'bshd' (FlashAttention's [B, S, H, D]), "
                                        "'bhsd' (SDPA's [B, H, S, D])"),
    ((Stand((1000, 3, 128)),), {}, "q has 3 dimensions, not 4 (FlashAttention's [B, S, H, D])"),
    ((Stand((2, 1000, 6, 128)), Stand((2, 1000, 4, 128)), Stand((2, 1000, 4, 128))), {},
     "6 query heads do not share 4 K/V heads evenly (grouped K/V heads need H_kv to divide H)"),
    ((Stand(BSHD), Stand(BSHD), Stand((2, 999, 3, 128))), {},
     "v is [B, H, S, D] = [2, 3, 999, 128], q [2, 3, 1000, 128]: q, k and v must agree in B, S"),
    ((Stand(BSHD), Stand(BSHD), Stand((2, 1000, 1, 128))), {}, "v is [B, H, S, D] = [2, 1, 1000, 128]"),
    ((Stand((2, 0, 3, 128)),), {}, "an empty input, [B, H, S, D] = [2, 3, 0, 128]"),
    ((Stand(BSHD, dtype="torch.float32"),), {}, "float32 inputs; the line runs fp16 and bf16"),
    ((Stand(BSHD), Stand(BSHD, dtype="torch.bfloat16")), {}, "q, k and v have different element types (bfloat16, float16)"),
    ((Stand((2, 1000, 8, 96), dtype="torch.bfloat16"), Stand((2, 1000, 2, 96), dtype="torch.bfloat16"),
      Stand((2, 1000, 2, 96), dtype="torch.bfloat16")), {"causal": True},
     "mask causal, D=96, bf16, grouped K/V heads is not a configuration the line runs; it runs dense (mask none, "
     "D=128, fp16), causal (mask causal, D=128, fp16), bf16 (mask none, D=128, bf16), gqa (mask none, D=128, fp16, "
     "grouped K/V heads)"),
    ((Stand((2, 1000, 3, 96)),), {}, "mask none, D=96, fp16 is not a configuration the line runs"),
    ((Stand(BSHD),), {"softmax_scale": "1/sqrt(D)"}, "softmax_scale is '1/sqrt(D)', not a number"),
    ((Stand(BSHD),), {"softmax_scale": [0.1]}, "softmax_scale is [0.1], not a number"),
    ((Stand(BSHD),), {"softmax_scale": "0.1"}, "softmax_scale is '0.1', not a number"),
    ((Stand(BSHD),), {"softmax_scale": float("nan")}, "softmax_scale is nan, not a finite number"),
    ((Stand(BSHD, device="cpu"),), {}, "the inputs are on the cpu; it runs on a CUDA GPU"),
    ((Stand(BSHD), Stand(BSHD, device="cpu")), {}, "q, k and v are on different devices (cpu, cuda:0)"),
    ((Stand(BSHD),), {"layout": ["bshd"]}, "layout ['bshd'] is not one of 'bshd'"),
    ((Stand(BSHD),), {"causal": "no"}, "causal is 'no', not True or False"),
    ((Stand(BSHD),), {"causal": 2}, "causal is 2, not True or False"),
])
def test_what_the_line_does_not_run_is_refused_in_one_line(inputs, kw, message):
    with pytest.raises(FlashbenchError) as e:
        call(*inputs, **kw)
    said = str(e.value)
    assert said.startswith("flash_attention: ") and message in said and "\n" not in said


@pytest.mark.parametrize("grad_enabled", [True, False])
def test_an_input_that_requires_grad_is_refused_where_autograd_records(grad_enabled, monkeypatch):
    """Forward alone: where autograd records, a call on an input that requires grad is refused; under
    no_grad it goes on to the other checks (here the element type's)."""
    import types

    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(is_grad_enabled=lambda: grad_enabled))
    k = Stand(BSHD, dtype="torch.float32", requires_grad=True)
    with pytest.raises(FlashbenchError) as e:
        call(Stand(BSHD, dtype="torch.float32"), k)
    said = str(e.value)
    if grad_enabled:
        assert said == ("flash_attention: k requires grad, and the line has no backward kernel: call it under "
                        "torch.no_grad() or torch.inference_mode(), or on detached inputs")
    else:
        assert said == "flash_attention: float32 inputs; the line runs fp16 and bf16"


def test_without_a_checkout_to_build_from_it_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setattr(api, "ROOT", tmp_path)
    api._settings.cache_clear()
    try:
        with pytest.raises(FlashbenchError, match=f"no config.yaml in {tmp_path}: it builds its kernels from the "
                                                  "flashbench checkout .* FLASHBENCH_ROOT"):
            call(Stand(BSHD))
    finally:
        api._settings.cache_clear()


def test_an_array_that_is_not_a_tensor_is_refused():
    import numpy as np

    with pytest.raises(FlashbenchError, match="q is a ndarray, not a torch tensor"):
        call(np.zeros(BSHD, np.float16))


def test_each_configuration_asks_for_its_best_build(settings):
    assert api.configuration_for(settings, False, 128, "fp16")[1] == settings.headline_in(settings.configurations[0])[0]
    causal, build = api.configuration_for(settings, True, 128, "fp16")
    assert causal.causal and build == settings.headline_in(causal)[0] and build.endswith(".causal")
    bf16, build = api.configuration_for(settings, False, 128, "bf16")
    assert bf16.dtype == "bf16" and build.endswith(".bf16")
    grouped, build = api.configuration_for(settings, False, 128, "fp16", grouped=True)
    assert grouped.kv_group > 1 and build.endswith(".gqa")
    d64, build = api.configuration_for(settings, False, 64, "fp16")
    assert d64.D == 64 and build.endswith(".d64")
    d256, build = api.configuration_for(settings, False, 256, "fp16")
    assert d256.D == 256 and build.endswith(".d256")
    # bf16 in every configuration: each its own build
    for causal, D, grouped, name in ((True, 128, False, "causal_bf16"), (False, 128, True, "gqa_bf16"),
                                     (False, 64, False, "d64_bf16"), (False, 256, False, "d256_bf16"),
                                     (True, 128, True, "gqa_causal_bf16"), (True, 64, False, "d64_causal_bf16"),
                                     (True, 256, False, "d256_causal_bf16"), (False, 64, True, "gqa_d64_bf16"),
                                     (False, 256, True, "gqa_d256_bf16"), (True, 64, True, "gqa_d64_causal_bf16"),
                                     (True, 256, True, "gqa_d256_causal_bf16")):
        configuration, build = api.configuration_for(settings, causal, D, "bf16", grouped=grouped)
        assert configuration.name == name and configuration.dtype == "bf16" and build == f"v25.{name}"
    # D=64 and D=256 under the mask, on full heads, and on grouped K/V heads with and without it (models with
    # GQA at those D)
    for D in (64, 256):
        causal_at_d, build = api.configuration_for(settings, True, D, "fp16")
        assert causal_at_d.causal and causal_at_d.D == D and build == f"v25.d{D}_causal"
        for causal, suffix in ((False, ""), (True, "_causal")):
            grouped_at_d, build = api.configuration_for(settings, causal, D, "fp16", grouped=True)
            assert grouped_at_d.kv_group > 1 and grouped_at_d.D == D and build == f"v25.gqa_d{D}{suffix}"
    # grouped K/V heads under the mask: a decoder's attention with GQA
    grouped_causal, build = api.configuration_for(settings, True, 128, "fp16", grouped=True)
    assert grouped_causal.causal and grouped_causal.kv_group > 1 and build == "v25.gqa_causal"


def test_an_input_is_read_as_its_strides_lie_where_tma_can():
    bshd = Stand(BSHD)  # FlashAttention's layout, contiguous: a row of S is H*D apart, a head D
    assert api._bhs_strides(bshd, "bshd") == (1000 * 3 * 128, 128, 3 * 128) and api._strides_readable(bshd, "bshd")
    bhsd = Stand((2, 3, 1000, 128))
    assert api._bhs_strides(bhsd, "bhsd") == (3 * 1000 * 128, 1000 * 128, 128) and api._strides_readable(bhsd, "bhsd")
    one_head = Stand((1, 1000, 1, 128), strides=(5, 128, 1, 1))  # a dimension of one may have any stride
    assert api._bhs_strides(one_head, "bshd") == (1000 * 128, 128, 128) and api._strides_readable(one_head, "bshd")
    packed = Stand(BSHD, strides=(1000 * 9 * 128, 9 * 128, 128, 1))  # q of a packed [B, S, 3, H, D] qkv
    assert api._strides_readable(packed, "bshd")
    assert not api._strides_readable(Stand(BSHD, strides=(384000, 384, 1, 3)), "bshd")  # D not contiguous
    assert not api._strides_readable(Stand(BSHD, strides=(384000, 388, 128, 1)), "bshd")  # rows 776 bytes apart


def test_a_refused_call_leaves_nothing_resolved_behind():
    before = dict(api._calls)
    with pytest.raises(FlashbenchError, match="D=96, fp16 is not a configuration the line runs"):
        call(Stand((2, 1000, 3, 96)))
    assert api._calls == before



def test_the_build_cache_holds_whole_cubins_only(tmp_path):
    cubin = tmp_path / "sm_90a" / "v25-0123.cubin"
    builds = []

    def build(to, content=b"cubin"):
        builds.append(to)
        to.write_bytes(content)
        return {"cubin_sha256": hashlib.sha256(content).hexdigest()}

    record = api._cached_build(cubin, build)
    assert cubin.read_bytes() == b"cubin" and builds[0].parent != cubin.parent  # built apart, then moved in
    assert api._cached_build(cubin, build) == record and len(builds) == 1  # reused
    cubin.write_bytes(b"cub")  # cut short: not the cubin its record names, so built again
    assert api._cached_build(cubin, build) == record and len(builds) == 2 and cubin.read_bytes() == b"cubin"
    for damaged in ('{"cubin_sha', "[1, 2]"):  # a record cut short, or no record at all: built again
        cubin.with_suffix(".json").write_text(damaged)
        assert api._cached_build(cubin, build) == record and cubin.with_suffix(".json").read_text() != damaged
    assert len(builds) == 4

    def failing(to):
        to.write_bytes(b"half")
        raise FlashbenchError("nvcc failed")

    cubin.write_bytes(b"")
    with pytest.raises(FlashbenchError, match="nvcc failed"):
        api._cached_build(cubin, failing)
    assert cubin.read_bytes() == b"" and sorted(p.name for p in cubin.parent.iterdir()) == [cubin.name,
                                                                                           "v25-0123.json"]


# ---- on the GPU, with torch ----------------------------------------------------------------------------

def _torch():
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the line's kernels are built for sm_90a")
    return torch


def _sdpa(torch, q, k, v, causal, layout):
    """SDPA's math backend in fp32 on the same values, in `layout` (K and V of fewer heads: enable_gqa)."""
    f = (lambda x: x.float().transpose(1, 2)) if layout == "bshd" else (lambda x: x.float())
    q, k, v = f(q), f(k), f(v)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                               enable_gqa=k.shape[1] != q.shape[1])
    return out.transpose(1, 2) if layout == "bshd" else out


# The largest error against SDPA's fp32 math that passes, and a defect that must fail: bf16 keeps 8 bits
# of mantissa to fp16's 11, so its outputs round 8 times as coarsely.
WITHIN = {"float16": (4e-3, 0.05), "bfloat16": (3e-2, 0.4)}


def _agrees(torch, out, q, k, v, causal, layout):
    """`out` within WITHIN of SDPA on the same values, and the same comparison failing with one element of
    one row moved (a planted defect)."""
    within, defect = WITHIN[str(out.dtype).removeprefix("torch.")]
    ref = _sdpa(torch, q, k, v, causal, layout)
    err = (out.float() - ref).abs()
    assert err.max().item() < within, (err.max().item(), err.flatten(0, -2).amax(-1).argmax().item())
    S = out.shape[1] if layout == "bshd" else out.shape[2]
    out[0, S // 2 if layout == "bshd" else 0, 0 if layout == "bshd" else S // 2, 5] += defect
    assert (out.float() - ref).abs().max().item() > within


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("S", [1000, 1050, 256, 77])
def test_it_agrees_with_sdpa_in_both_layouts(layout, causal, S, tmp_path, monkeypatch):
    torch = _torch()
    monkeypatch.setenv("FLASHBENCH_CACHE", str(tmp_path.parent / "flashbench-cache"))  # one build for the session
    B, H, D = 2, 3, 128
    shape = (B, S, H, D) if layout == "bshd" else (B, H, S, D)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.float16) for _ in range(3))
    out = flashbench.flash_attention(q, k, v, causal=causal, layout=layout)
    assert out.shape == shape and out.dtype == torch.float16
    _agrees(torch, out, q, k, v, causal, layout)


@pytest.mark.gpu
def test_inputs_that_require_grad_run_under_no_grad_alone(tmp_path, monkeypatch):
    torch = _torch()
    monkeypatch.setenv("FLASHBENCH_CACHE", str(tmp_path.parent / "flashbench-cache"))
    q, k, v = (torch.randn(1, 300, 2, 128, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(3))
    with pytest.raises(FlashbenchError, match="^flash_attention: q requires grad, and the line has no backward kernel"):
        flashbench.flash_attention(q, k, v)
    with torch.no_grad():
        out = flashbench.flash_attention(q, k, v)
    _agrees(torch, out, q.detach(), k.detach(), v.detach(), False, "bshd")


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
# 16: at D=256 under the mask, row tile 0 has 64 rows past S; 150: at D=64 under it, the row tiles start 106 rows
# before row 0, one more than S's
@pytest.mark.parametrize("S", [1000, 150, 16])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("kv_heads, D, causal", [(6, 128, True), (2, 128, False), (1, 128, False), (2, 128, True),
                                                 (1, 128, True), (6, 64, False), (6, 64, True), (6, 256, False),
                                                 (6, 256, True), (2, 64, False), (2, 256, False), (2, 64, True),
                                                 (2, 256, True)])
def test_bf16_grouped_kv_heads_and_other_head_dims_agree_with_sdpa(layout, S, dtype, kv_heads, D, causal, tmp_path,
                                                                     monkeypatch):
    """In fp16 and in bf16 (every configuration has its bf16 twin): under the mask, on grouped K/V heads (3
    query heads a K/V head, GQA, and all 6 on one, MQA) with and without it, at D=64 and at D=256, with and
    without the mask, on full heads and on grouped K/V heads."""
    torch = _torch()
    monkeypatch.setenv("FLASHBENCH_CACHE", str(tmp_path.parent / "flashbench-cache"))
    B, H = 2, 6
    shape = lambda heads: (B, S, heads, D) if layout == "bshd" else (B, heads, S, D)  # noqa: E731
    q = torch.randn(shape(H), device="cuda", dtype=getattr(torch, dtype))
    k, v = (torch.randn(shape(kv_heads), device="cuda", dtype=q.dtype) for _ in range(2))
    out = flashbench.flash_attention(q, k, v, causal=causal, layout=layout)
    assert out.shape == q.shape and out.dtype == q.dtype
    _agrees(torch, out, q, k, v, causal, layout)


@pytest.mark.gpu
def test_no_input_is_copied_in_either_layout_and_the_output_is_the_one_allocation(tmp_path, monkeypatch):
    torch = _torch()
    monkeypatch.setenv("FLASHBENCH_CACHE", str(tmp_path.parent / "flashbench-cache"))
    for layout, shape in (("bshd", (1, 1024, 8, 128)), ("bhsd", (1, 8, 1024, 128))):
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.float16) for _ in range(3))
        flashbench.flash_attention(q, k, v, layout=layout)  # built, and its work list made
        out = again = None  # the last layout's, freed before the count
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        out = flashbench.flash_attention(q, k, v, layout=layout)
        assert torch.cuda.memory_allocated() - before == out.numel() * 2, layout
        # a view whose D is not contiguous is copied, and still right
        strided = q.transpose(-1, -2).contiguous().transpose(-1, -2)
        again = flashbench.flash_attention(strided, k, v, layout=layout)
        assert torch.equal(again, out)


@pytest.mark.gpu
def test_a_call_is_resolved_once_a_signature_and_a_view_off_16_bytes_is_copied(tmp_path, monkeypatch):
    """The checks, the build and the strides once for each layout, mask, scale (a 0-d tensor's value at the
    call) and inputs' element types, devices, shapes and strides; a view that starts off a 16-byte boundary
    (which TMA cannot read) copied at its call, whatever its signature resolved to."""
    torch = _torch()
    monkeypatch.setenv("FLASHBENCH_CACHE", str(tmp_path.parent / "flashbench-cache"))
    monkeypatch.setattr(api, "_calls", {})
    resolved, resolve = [], api._resolved
    monkeypatch.setattr(api, "_resolved", lambda *call: resolved.append(call[3:]) or resolve(*call))
    q, k, v = (torch.randn((1, 1000, 4, 128), device="cuda", dtype=torch.float16) for _ in range(3))
    first = flashbench.flash_attention(q, k, v)
    assert torch.equal(flashbench.flash_attention(q.clone(), k.clone(), v.clone()), first) and len(resolved) == 1
    flashbench.flash_attention(q, k, v, causal=True)
    flashbench.flash_attention(q, k, v, softmax_scale=0.1)
    flashbench.flash_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), layout="bhsd")
    assert resolved == [(False, "bshd", None), (True, "bshd", None), (False, "bshd", 0.1), (False, "bhsd", None)]
    packed = torch.randn((1, 1000, 3, 4, 128), device="cuda", dtype=torch.float16)  # q, k, v of one [B, S, 3, H, D]
    out = flashbench.flash_attention(*packed.unbind(2))  # q's shape, other strides: resolved again, read as they lie
    assert len(resolved) == 5
    _agrees(torch, out, *packed.unbind(2), False, "bshd")
    scale = torch.tensor(0.1, dtype=torch.float64)  # a 0-d tensor: its value read at each call
    at_scale = flashbench.flash_attention(q, k, v, softmax_scale=scale)
    assert torch.equal(at_scale, flashbench.flash_attention(q, k, v, softmax_scale=0.1)) and len(resolved) == 5
    scale.fill_(0.2)
    assert not torch.equal(flashbench.flash_attention(q, k, v, softmax_scale=scale), at_scale) and len(resolved) == 6
    flat = torch.empty(q.numel() + 4, dtype=q.dtype, device="cuda")
    off = flat[4:].view(q.shape)  # 8 bytes past the allocation's start, q's strides
    off.copy_(q)
    assert off.data_ptr() % 16 == 8 and off.stride() == q.stride()
    assert torch.equal(flashbench.flash_attention(off, k, v), first) and len(resolved) == 6


@pytest.mark.gpu
def test_a_call_captured_in_a_cuda_graph_replays_on_new_inputs(tmp_path, monkeypatch):
    torch = _torch()
    monkeypatch.setenv("FLASHBENCH_CACHE", str(tmp_path.parent / "flashbench-cache"))
    shape = (2, 1000, 4, 128)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.float16) for _ in range(3))
    fresh = (torch.randn(shape, device="cuda", dtype=torch.float16) for _ in range(3))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        flashbench.flash_attention(q, k, v, causal=True)  # the first call at this shape, outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flashbench.flash_attention(q, k, v, causal=True)
    for static, new in zip((q, k, v), fresh):
        static.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    assert (out.float() - _sdpa(torch, q, k, v, True, "bshd")).abs().max().item() < 4e-3
    with warnings.catch_warnings():  # torch warns that the refused capture's graph is empty
        warnings.simplefilter("ignore", UserWarning)
        with pytest.raises(FlashbenchError, match="inside a CUDA graph capture; call it once at that shape before"):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                flashbench.flash_attention(q[:, :999], k[:, :999], v[:, :999])


# Calls in both layouts, with and without the mask, in bf16, on one K/V head for three query heads (at D=64 and
# 256 too), at D=64 and 256 (under the mask too), at three ragged S (150 and 16: the entry for a last key tile of
# 1 to 32 keys; 1000: the other, in key tiles of 128 and of 64) and an odd B*H: what compute-sanitizer runs.
# FlashAttention's layout reads each head's rows H*D apart, which the pipeline's contiguous inputs never do.
CALLS = """
import sys, torch, flashbench
for layout in ("bshd", "bhsd"):
    for causal, dtype, kv_heads, D in ((False, torch.float16, 3, 128), (True, torch.float16, 3, 128),
                                       (False, torch.bfloat16, 3, 128), (False, torch.float16, 1, 128),
                                       (False, torch.float16, 3, 64), (False, torch.float16, 3, 256),
                                       (True, torch.float16, 3, 256), (False, torch.float16, 1, 64),
                                       (False, torch.float16, 1, 256)):
        for S in (150, 1000, 16):
            shape = lambda heads: (1, S, heads, D) if layout == "bshd" else (1, heads, S, D)
            q = torch.randn(shape(3), device="cuda", dtype=dtype)
            k, v = (torch.randn(shape(kv_heads), device="cuda", dtype=dtype) for _ in range(2))
            flashbench.flash_attention(q, k, v, causal=causal, layout=layout)
torch.cuda.synchronize()
"""


@pytest.mark.gpu
@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "synccheck"])
def test_its_calls_are_clean_under_compute_sanitizer(tool, tmp_path):
    _torch()
    sanitizer = shutil.which("compute-sanitizer")
    if sanitizer is None:
        pytest.skip("compute-sanitizer not found")
    env = {**os.environ, "FLASHBENCH_CACHE": str(tmp_path.parent / "flashbench-cache")}
    proc = subprocess.run([sanitizer, "--tool", tool, "--error-exitcode", "9", sys.executable, "-c", CALLS],
                          capture_output=True, text=True, timeout=300, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-2000:]
    assert "ERROR SUMMARY: 0 errors" in out or "RACECHECK SUMMARY: 0 hazards" in out, out[-2000:]
