"""flash_attention: the Hopper line's best kernel, called from PyTorch.

    out = flashbench.flash_attention(q, k, v, causal=True)  # q, k, v: [B, S, H, D] fp16 or bf16 on an H100/H200

The kernel is config.yaml's best headline version that runs in the configuration the call asks for
(the mask, D, the element type, and whether K and V have fewer heads than Q): V25 today, any S, fp16 or
bf16, at D=64, 128 and 256, with or without the causal mask, on full or grouped K/V heads (GQA, MQA: any
H_kv that divides H, as the build of a configuration with a kv_group takes the group at launch). Both
come from the flashbench checkout (an editable install's, or the one FLASHBENCH_ROOT names). It is
compiled with nvcc on its first call in a process (into FLASHBENCH_CACHE, ~/.cache/flashbench unless set,
and reused from there while its source, headers, flags and nvcc stay the same), and launched on torch's
current stream, so that it can be captured in a CUDA graph.

A call's checks, its kernel and the strides it reads each input at are worked out once for its signature
(layout, mask, scale, and each input's element type, device, shape and strides) and kept for the
process's life; a later call of that signature allocates the output and launches. The kernel keeps the
TMA tensor maps of the addresses it was called at last (launch.PARAMS_KEPT sets of them).

Inputs are read where they lie: the kernel's TMA reads any [B, H, S, D] view whose D is contiguous,
whose other strides are multiples of 16 bytes and which starts on a 16-byte boundary, FlashAttention's
[B, S, H, D] (`layout="bshd"`, the default) and SDPA's [B, H, S, D] (`layout="bhsd"`) among them; an
input laid out otherwise is copied first. The output is a new [B, H, S, D] buffer, returned as the layout
asked (for "bshd" a transposed view of it). What the line does not run (another D or element type, a GPU
other than sm_90) is refused with one line that says so; so is an input that requires grad where autograd
records, as the line has a forward kernel alone.

Before a CUDA graph captures a call, make one call at that shape outside the capture: it builds the
kernel and the work list the persistent grid walks (kept for the life of the process, as a graph
holds its address). As with any CUDA graph, the tensors it was captured on must outlive it.
"""
from __future__ import annotations

import functools
import hashlib
import math
import os
import tempfile
import threading
from pathlib import Path

from . import FlashbenchError
from .files import read_json, sha256, write_json

LAYOUTS = {"bshd": "FlashAttention's [B, S, H, D]", "bhsd": "SDPA's [B, H, S, D]"}
ROOT = Path(os.environ.get("FLASHBENCH_ROOT") or Path(__file__).resolve().parents[2])  # config.yaml, kernels/
_kernels: dict = {}  # (build, device index) -> AttentionKernel, for the process's life (and so its work lists)
_kernels_lock = threading.Lock()


def flash_attention(q, k, v, causal: bool = False, layout: str = "bshd", softmax_scale: float | None = None):
    """softmax(q k^T * softmax_scale, masked after each query where `causal`) v, for torch tensors in
    `layout` ("bshd": [B, S, H, D], "bhsd": [B, H, S, D]) on one CUDA device, k and v of H or fewer heads
    (each read by H / H_kv consecutive query heads, as SDPA's enable_gqa); returns the output in the same
    layout. softmax_scale: 1/sqrt(D) unless given."""
    scale = _softmax_scale(softmax_scale)
    if not _is_true_or_false(causal):
        raise FlashbenchError(f"flash_attention: causal is {causal!r}, not True or False")
    _refuse_inputs_needing_grad(q, k, v)
    try:
        signature = (layout, bool(causal), scale, q.dtype, q.device, q.shape, q.stride(), k.dtype, k.device, k.shape,
                     k.stride(), v.dtype, v.device, v.shape, v.stride())
        call = _calls.get(signature)
    except (AttributeError, TypeError):  # not torch tensors, or a layout of no hash: _resolved says which
        signature = call = None
    if call is None:
        call = _resolved(q, k, v, causal, layout, scale)
        if signature is not None:
            _calls[signature] = call
    return call(q, k, v)


class _Call:
    """What a call's signature (layout, mask, scale, and each input's element type, device, shape and strides)
    resolves to once: the kernel, its logical grid and the strides it reads each input at. Calling it with
    inputs of that signature allocates the output and launches the kernel on torch's current stream."""

    def __init__(self, kernel, device: int, layout: str, shape: tuple[int, int, int, int], kv_heads: int,
                 scale: float | None, inputs: tuple):
        B, H, S, D = shape
        self.kernel, self.device, self.layout, self.shape = kernel, device, layout, shape
        self.kv_group, self.row_tiles, self.heads = H // kv_heads, kernel.row_tiles(S), B * H
        self.scale = scale
        # an input whose strides TMA cannot read is copied at each call, and read as the copy lies
        self.copied = tuple(not _strides_readable(x, layout) for x in inputs)
        self.strides = {name: _bhs_strides(x, layout) for name, x, copied in zip("qkv", inputs, self.copied)
                        if not copied}

    def __call__(self, q, k, v):
        import torch

        strides, inputs = self.strides, []
        for name, x, copied in zip("qkv", (q, k, v), self.copied):
            if copied or x.data_ptr() % 16:  # TMA reads from a 16-byte boundary: a view off one is copied too
                x = x.clone(memory_format=torch.contiguous_format)
                strides = {**strides, name: _bhs_strides(x, self.layout)}
            inputs.append(x)
        q, k, v = inputs
        B, H, S, D = self.shape
        o = torch.empty(self.shape, dtype=q.dtype, device=q.device)
        kernel = self.kernel
        with kernel.cp.cuda.Device(self.device):
            if torch.cuda.is_current_stream_capturing() and not kernel.work_list_made(self.row_tiles, self.heads, H, S,
                                                                                      self.kv_group):
                raise FlashbenchError(f"flash_attention: first called at B={B} H={H} S={S} inside a CUDA graph "
                                      "capture; call it once at that shape before capturing (it makes the kernel's "
                                      "work list)")
            kernel.launch(self.row_tiles, self.heads, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), S,
                          self.scale, H, strides=strides, stream=torch.cuda.current_stream(self.device).cuda_stream,
                          kv_group=self.kv_group)
        return o.transpose(1, 2) if self.layout == "bshd" else o


_calls: dict = {}  # a call's signature -> _Call, for the process's life (as the kernels and their work lists)


def _resolved(q, k, v, causal: bool, layout: str, scale: float | None) -> _Call:
    """The _Call of a call's inputs, after every check of what the line takes (each refusal one line)."""
    B, H, S, D, kv_heads = _shape(q, k, v, layout)
    device = _device(q, k, v)
    _, build = configuration_for(_settings(), causal, D, _dtype(q, k, v), grouped=kv_heads != H)
    from .config import Shape

    kernel = _kernel(build, device)
    if reason := kernel.supports(Shape(B, H, S, D)):
        raise FlashbenchError(f"flash_attention: {reason}")
    return _Call(kernel, device, layout, (B, H, S, D), kv_heads, scale, (q, k, v))


# ---- what a call may be given (no torch needed: the refusals are tested without a GPU) ---------------

def _softmax_scale(value) -> float | None:
    """The scale a call gives as a float (None: 1/sqrt(D)), read at each call, as a 0-d tensor may change;
    refused where it is no finite number."""
    if value is None:
        return None
    try:
        scale = None if isinstance(value, (str, bytes)) else float(value)
    except (TypeError, ValueError, RuntimeError):  # RuntimeError: a tensor of more than one element
        scale = None
    if scale is None:
        raise FlashbenchError(f"flash_attention: softmax_scale is {value!r}, not a number")
    if not math.isfinite(scale):
        raise FlashbenchError(f"flash_attention: softmax_scale is {scale}, not a finite number")
    return scale


def _is_true_or_false(value) -> bool:
    """True or False as Python, numpy or a one-element tensor has them (or 1 and 0); not "no", which bool() takes
    as True."""
    if isinstance(value, (str, bytes)):
        return False
    try:
        return bool(value in (True, False))
    except (TypeError, ValueError, RuntimeError):  # an array of several elements
        return False


def _refuse_inputs_needing_grad(q, k, v) -> None:
    """The line has a forward kernel alone: an input that requires grad, where autograd records, is refused
    (the output would hold no grad_fn, and a training step would silently leave q, k and v's producers
    untrained). Read at each call, as requires_grad and the grad mode are no part of the signature."""
    needing = [name for name, x in (("q", q), ("k", k), ("v", v)) if getattr(x, "requires_grad", False) is True]
    if needing:
        import torch

        if torch.is_grad_enabled():
            raise FlashbenchError(f"flash_attention: {needing[0]} requires grad, and the line has no backward kernel: "
                                  "call it under torch.no_grad() or torch.inference_mode(), or on detached inputs")


def _shape(q, k, v, layout: str) -> tuple[int, int, int, int, int]:
    """B, H, S, D of q and H_kv, the heads of k and v, which must have q's shape but for H_kv dividing H."""
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise FlashbenchError(f"flash_attention: layout {layout!r} is not one of "
                              + ", ".join(f"{name!r} ({what})" for name, what in LAYOUTS.items()))
    shapes = {}
    for name, x in (("q", q), ("k", k), ("v", v)):
        shape = getattr(x, "shape", None)
        if shape is None or not hasattr(x, "data_ptr"):
            raise FlashbenchError(f"flash_attention: {name} is a {type(x).__name__}, not a torch tensor")
        if len(shape) != 4:
            raise FlashbenchError(f"flash_attention: {name} has {len(shape)} dimensions, not 4 ({LAYOUTS[layout]})")
        B, X, Y, D = (int(n) for n in shape)
        shapes[name] = (B, X, Y, D) if layout == "bhsd" else (B, Y, X, D)
    B, H, S, D = shapes["q"]
    kv_heads = shapes["k"][1]
    for name in ("k", "v"):
        if (shapes[name][0], shapes[name][2], shapes[name][3]) != (B, S, D) or shapes[name][1] != kv_heads:
            raise FlashbenchError(f"flash_attention: {name} is [B, H, S, D] = {list(shapes[name])}, q {list(shapes['q'])}: "
                                  "q, k and v must agree in B, S (of the keys as of the queries) and D, and k and v "
                                  "in H")
    if min(B, H, S, D, kv_heads) < 1:
        raise FlashbenchError(f"flash_attention: an empty input, [B, H, S, D] = {[B, H, S, D]}, {kv_heads} K/V heads")
    if H % kv_heads:
        raise FlashbenchError(f"flash_attention: {H} query heads do not share {kv_heads} K/V heads evenly (grouped K/V "
                              "heads need H_kv to divide H)")
    return B, H, S, D, kv_heads


def _dtype(q, k, v) -> str:
    names = {str(x.dtype).removeprefix("torch.") for x in (q, k, v)}
    if len(names) > 1:
        raise FlashbenchError(f"flash_attention: q, k and v have different element types ({', '.join(sorted(names))})")
    name = names.pop()
    from .elements import TORCH_NAMES

    dtype = {torch_name: ours for ours, torch_name in TORCH_NAMES.items()}.get(name)
    if dtype is None:
        raise FlashbenchError(f"flash_attention: {name} inputs; the line runs fp16 and bf16")
    return dtype


def _device(q, k, v) -> int:
    devices = {(x.device.type, x.device.index) for x in (q, k, v)}
    if len(devices) > 1:
        names = sorted(kind if index is None else f"{kind}:{index}" for kind, index in devices)
        raise FlashbenchError(f"flash_attention: q, k and v are on different devices ({', '.join(names)})")
    kind, index = devices.pop()
    if kind != "cuda":
        raise FlashbenchError(f"flash_attention: the inputs are on the {kind}; it runs on a CUDA GPU")
    return index or 0


def configuration_for(settings, causal: bool, D: int, dtype: str, grouped: bool = False):
    """The configuration of the settings a call asks for (`grouped`: K and V of fewer heads than Q, which
    a configuration with a kv_group runs, whatever the group), and its best build there, or a
    FlashbenchError that says what the line runs."""
    mask = "causal" if causal else "none"

    def said(mask, D, dtype, grouped):
        return f"mask {mask}, D={D}, {dtype}{', grouped K/V heads' if grouped else ''}"

    for configuration in settings.configurations:
        if (configuration.mask, configuration.D, configuration.dtype, configuration.kv_group > 1) == \
                (mask, D, dtype, grouped):
            builds = settings.headline_in(configuration)
            if builds:
                return configuration, builds[0]
    runs = ", ".join(f"{c.name} ({said(c.mask, c.D, c.dtype, c.kv_group > 1)})" for c in settings.configurations
                     if settings.headline_in(c))
    raise FlashbenchError(f"flash_attention: {said(mask, D, dtype, grouped)} is not a configuration the line runs; "
                          f"it runs {runs}")


# ---- the kernel, built once (GPU) --------------------------------------------------------------------

@functools.cache
def _settings():
    """config.yaml's settings, read once a process."""
    from . import config

    if not (ROOT / "config.yaml").is_file():
        raise FlashbenchError(f"flash_attention: no config.yaml in {ROOT}: it builds its kernels from the flashbench "
                              "checkout (an editable install, pip install -e .), or from the one FLASHBENCH_ROOT names")
    return config.load(ROOT / "config.yaml")


def _kernel(build: str, device: int):
    key = (build, device)
    with _kernels_lock:  # two threads' first calls build and load a kernel once
        if key not in _kernels:
            _kernels[key] = _load(_settings(), build, device)
        return _kernels[key]


def _load(settings, build: str, device: int):
    import cupy as cp

    from .compile import compile_kernel, nvcc_version, runnable_build
    from .launch import AttentionKernel

    with cp.cuda.Device(device):
        here = "sm_" + cp.cuda.Device(device).compute_capability
        kernel = settings.kernel(settings.run(build).of)
        arch = runnable_build(kernel.archs, here) if kernel.archs else here
        if arch is None:
            raise FlashbenchError(f"flash_attention: {kernel.name} is built for {', '.join(kernel.archs)}; this GPU is "
                                  f"{here}")
        source, defines = ROOT / kernel.source, settings.defines(build)
        inputs = [sha256(source), *(sha256(p) for p in sorted(source.parent.glob("*.cuh"))), nvcc_version(), arch,
                  repr(settings.nvcc_flags), repr(sorted(defines.items()))]
        digest = hashlib.sha256("\n".join(inputs).encode()).hexdigest()[:16]
        cubin = _cache_dir() / arch / f"{build}-{digest}.cubin"
        return AttentionKernel(cubin, _cached_build(cubin, lambda to: compile_kernel(build, source, arch,
                                                                                   settings.nvcc_flags, defines, to)))


def _cached_build(cubin: Path, build) -> dict:
    """The record of the cache's `cubin`, built first where it or its record is missing or cannot be read, or
    it is not the cubin its record names (cut short, or damaged): `build(path)` compiles into a folder of its
    own, whose cubin replaces the cache's whole and then its record, so that processes sharing the cache (a
    job's ranks) never read half a cubin, and one stopped mid-build leaves the cache as it was."""
    record_path = cubin.with_suffix(".json")
    if cubin.is_file() and record_path.is_file():
        try:
            record = read_json(record_path)
        except FlashbenchError:  # cut short or damaged: built again
            record = None
        if isinstance(record, dict) and record.get("cubin_sha256") == sha256(cubin):
            return record
    cubin.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cubin.parent, prefix=f".{cubin.stem}.") as folder:
        record = build(Path(folder) / cubin.name)
        os.replace(Path(folder) / cubin.name, cubin)
    write_json(record_path, record)
    return record


def _cache_dir() -> Path:
    return Path(os.environ.get("FLASHBENCH_CACHE") or Path.home() / ".cache" / "flashbench")


def _bhs_strides(x, layout: str) -> tuple[int, int, int]:
    """The elements between consecutive b, h and s of an input in `layout` (of a dimension of one, its
    stride in a contiguous input: torch may give such a dimension any stride)."""
    strides, sizes = list(x.stride()[:3]), list(x.shape)
    contiguous = [sizes[1] * sizes[2] * sizes[3], sizes[2] * sizes[3], sizes[3]]
    strides = [c if n == 1 else s for s, n, c in zip(strides, sizes, contiguous)]
    return (strides[0], strides[1], strides[2]) if layout == "bhsd" else (strides[0], strides[2], strides[1])


def _strides_readable(x, layout: str) -> bool:
    """Whether TMA reads `x` as its strides lay it out: D contiguous, every other stride a multiple of 16 bytes
    (where it starts, a 16-byte boundary, is each call's to check)."""
    return x.stride(3) == 1 and all(s % 8 == 0 for s in _bhs_strides(x, layout))
