"""Peers: the same check and timing as the kernels, on the same CuPy inputs.

PyTorch's own attention (SDPA with automatic dispatch or held to one backend, and the unfused form)
runs on the CuPy arrays themselves (shared through DLPack, no copies). FlashAttention's own forward
in CuTe DSL (the flash-attn-4 package, `flash_attn.cute`) takes [B, S, H, D]: it gets a copy of the
same values in that layout, made with the inputs (before any timing), and its output is compared
after transposing back.

Both need torch, and FlashAttention's peer its package too: where either is missing, or the library
has no kernel for the GPU, the peer is skipped (PeerUnavailable) and the report says why.
"""
from __future__ import annotations

import functools
import importlib
import os

from . import FlashbenchError, NoKernelForShape, attention
from .config import DENSE, Configuration, Peer, Shape

# What torch says when SDPA, held to a backend, has no kernel for the inputs: the one error that
# makes a point skipped rather than the stage failed.
NO_KERNEL = "No available kernel"
FLASH_ATTN_CUTE = "flash_attn_cute"
FLASH_ATTN_CUTE_CACHE = "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"  # its compiled kernels kept on disk (FlashAttnCutePeer)
# FlashAttention's CuTe DSL forward has a path per major compute capability (flash_attn.cute.interface)
FLASH_ATTN_CUTE_PATHS = {8: "sm80 (Ampere)", 9: "sm90 (Hopper)", 10: "sm100 (Blackwell)", 11: "sm100 (Blackwell)",
                         12: "sm120 (Blackwell GeForce)"}


# What a peer's identity may hold (TorchPeer.identity, FlashAttnCutePeer.identity), as its check records it
IDENTITY_KEYS = ("torch", "cudnn", "flash_attn", "cutlass_dsl", "path", "backend")


class PeerUnavailable(FlashbenchError):
    """The peer cannot run here at all (no torch, no FlashAttention, no kernel for this GPU): skipped."""


def installed_version(package: str) -> str | None:
    """An installed package's version, None where there is none (read from its metadata, not
    imported: the workflow asks as it loads)."""
    import importlib.metadata

    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def libraries(peer: Peer) -> dict:
    """The packages `peer` needs and their installed versions (None: missing). A rule that takes
    them as a parameter reruns once one is installed or changes, so a record skipped for want of a
    package is not up to date once it is there."""
    needs = ["torch"] + (["flash-attn-4", "nvidia-cutlass-dsl"] if peer.backend == FLASH_ATTN_CUTE else [])
    return {package: installed_version(package) for package in needs}


def import_libraries(peer: Peer) -> None:
    """Import what `peer` runs on (torch, and flash_attn.cute for FlashAttention's), which touches no
    GPU: a stage does it before it waits for the GPU's lock, beside the job that holds the GPU. One
    that does not import is left to the peer's making, which says why."""
    try:
        importlib.import_module("torch")
        if peer.backend == FLASH_ATTN_CUTE:
            _flash_attn_cute()
    except Exception:
        pass


_flash_attn_cute_failure: list[str] = []  # why flash_attn.cute did not import, the first time


def _flash_attn_cute():
    """flash_attn.cute, its disk cache of compiled kernels switched on unless the environment says
    otherwise; where it does not import, PeerUnavailable with the first failure's reason (a second
    import can fail otherwise, past the modules the first left loaded)."""
    if not _flash_attn_cute_failure:
        os.environ.setdefault(FLASH_ATTN_CUTE_CACHE, "1")  # read when flash_attn.cute imports
        try:
            return importlib.import_module("flash_attn.cute")
        except Exception as e:  # the DSL's own imports (its CUDA libraries) fail in many ways
            _flash_attn_cute_failure.append(f"{type(e).__name__}: {e}")
    raise PeerUnavailable(f"flash_attn.cute does not import: {_flash_attn_cute_failure[0]}")


def require(peer: Peer) -> None:
    """Raise PeerUnavailable where a package the peer needs is not installed (asked once the GPU is
    known to be there; whether the library has a kernel for the GPU is asked when the peer is made)."""
    have = libraries(peer)
    if have["torch"] is None:
        raise PeerUnavailable("torch is not installed")
    if peer.backend == FLASH_ATTN_CUTE and have["flash-attn-4"] is None:
        raise PeerUnavailable("flash-attn-4 (FlashAttention's CuTe DSL kernels, flash_attn.cute) is not installed")


def make(peer: Peer, configuration: Configuration = DENSE, name: str | None = None):
    """The implementation of a configured peer in `configuration` (its mask, element type and K/V heads),
    named `name` (its run's, sdpa_cudnn.causal) where given, else the peer's."""
    impl = (FlashAttnCutePeer if peer.backend == FLASH_ATTN_CUTE else TorchPeer)(peer, configuration)
    impl.name = name or peer.name
    return impl


class _TorchBacked:
    """What every peer shares: torch on CuPy's stream, CuPy inputs, torch's CUDA-graph capture. A bf16
    input is a CuPy uint16 array (elements.py) that torch is given as bfloat16, the same memory; its
    output goes back as int16, which CuPy takes."""

    skips_unsupported = True  # above its max_seq_len a peer is not run, and says why

    def __init__(self, peer: Peer, configuration: Configuration = DENSE):
        require(peer)
        import cupy as cp
        import torch

        self.cp, self.torch, self.peer, self.name = cp, torch, peer, peer.name
        self.configuration, self.causal, self.dtype = configuration, configuration.causal, configuration.dtype
        if torch.cuda.current_stream().cuda_stream != cp.cuda.get_current_stream().ptr:
            raise FlashbenchError("torch and CuPy are on different CUDA streams: the events would not time torch")
        # CuPy array pointer -> (the array, the torch tensor the peer is given for it). The array is
        # held so that its memory, and so its pointer, cannot pass to another array while cached.
        self._tensors, self._tensors_shape = {}, None

    def activate(self) -> None:
        """Make torch dispatch this peer's calls as configured (a process holding several peers calls it
        before each one's calls: torch's backend switches are the process's)."""

    def supports(self, shape: Shape) -> str | None:
        if self.peer.max_seq_len and shape.S > self.peer.max_seq_len:
            return f"S={shape.S} is above {self.name}'s max_seq_len ({self.peer.max_seq_len})"
        return None

    def inputs(self, shape: Shape, rng, kind: str = "normal") -> tuple:
        """CuPy [B, H, S, D] inputs, and the tensors the library is given for them, made now. Every set
        made at one shape keeps its tensors (the cycle counts launch on several sets, and a call whose
        tensors were dropped would copy its inputs again inside what is measured); a set at another
        shape drops those of the last."""
        if shape != self._tensors_shape:
            self._tensors.clear()
            self._tensors_shape = shape
        q, k, v, o = attention.random_inputs(self.cp, shape, rng, kind, self.dtype, self.configuration.kv_heads(shape.H))
        for array in (q, k, v):
            self._tensor(array)
        return q, k, v, o

    def _tensor(self, array):
        held = self._tensors.get(array.data.ptr)
        if held is None:
            tensor = self.torch.from_dlpack(array)
            if self.dtype == "bf16":
                tensor = tensor.view(self.torch.bfloat16)
            held = self._tensors[array.data.ptr] = (array, self._as_input(tensor))
        return held[1]

    def _as_input(self, tensor):
        """The tensor the library takes for a [B, H, S, D] input (the same memory, for torch's own)."""
        return tensor

    def __call__(self, q, k, v, o):
        """Attention of q, k, v; returns the library's own output as [B, H, S, D] (o is left alone:
        the library allocates), bf16 as int16. Only "no kernel for these inputs" is a skip; any other
        error (out of memory, a CUDA error) stops the stage with the library's message."""
        try:
            out = self._attend(self._tensor(q), self._tensor(k), self._tensor(v))
            return out.view(self.torch.int16) if self.dtype == "bf16" else out
        except RuntimeError as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if NO_KERNEL in str(e):
                raise NoKernelForShape(f"torch has no {self.peer.backend} kernel for these inputs: {first}") from None
            raise FlashbenchError(f"{self.name} failed: {first}") from None

    def capture(self, q, k, v, o, calls: int):
        """`calls` calls captured once into a CUDA graph (torch's own capture, which keeps its
        allocator right); returns what replays it on the current stream."""
        torch = self.torch
        args = [self._tensor(a) for a in (q, k, v)]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up off the default stream, as capture asks
            self(q, k, v, o)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                self._attend(*args)
        return graph.replay


class TorchPeer(_TorchBacked):
    """torch's SDPA (automatic dispatch or one backend) or the unfused softmax(QK^T / sqrt(D)) V."""

    def __init__(self, peer: Peer, configuration: Configuration = DENSE):
        super().__init__(peer, configuration)
        import torch.nn.functional as F

        if peer.backend == "unfused":
            self._attend = self._unfused
        else:  # grouped K/V heads: SDPA's enable_gqa, asked for only where the configuration groups them
            options = {**({"is_causal": True} if self.causal else {}),
                       **({"enable_gqa": True} if configuration.kv_group > 1 else {})}
            self._attend = functools.partial(F.scaled_dot_product_attention, **options) if options \
                else F.scaled_dot_product_attention
        self.activate()

    def activate(self) -> None:
        """SDPA with automatic dispatch, or held to one backend, by torch's process-wide switches: set
        here, not by an sdpa_kernel() context around every call, which would add its own CPU time to
        calls timed back to back. The stages run one peer a process and set them once; the
        head-to-head holds several and sets them before each one's calls (a captured graph keeps the
        kernel it was captured with)."""
        if self.peer.backend == "unfused":
            return
        cuda = self.torch.backends.cuda
        switches = {"cudnn": cuda.enable_cudnn_sdp, "flash": cuda.enable_flash_sdp,
                    "efficient": cuda.enable_mem_efficient_sdp, "math": cuda.enable_math_sdp}
        for backend, enable in switches.items():
            enable(self.peer.backend in ("auto", backend))

    def _unfused(self, q, k, v):
        if k.shape[1] != q.shape[1]:  # grouped K/V heads: each repeated for the query heads that read it
            k, v = (a.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for a in (k, v))
        logits = (q @ k.transpose(-2, -1)) * attention.softmax_scale(q.shape[-1])
        if self.causal:
            S = logits.shape[-1]
            logits = logits.masked_fill(~self.torch.ones(S, S, dtype=self.torch.bool, device=q.device).tril(),
                                        float("-inf"))
        return self.torch.softmax(logits, dim=-1) @ v

    @property
    def identity(self) -> dict:
        torch = self.torch
        return {"torch": torch.__version__, "cudnn": str(torch.backends.cudnn.version()), "backend": self.peer.backend}


class FlashAttnCutePeer(_TorchBacked):
    """FlashAttention's forward through its public interface, flash_attn.cute.flash_attn_func, on
    [B, S, H, D] copies of the inputs. Its first call in a configuration compiles the kernel (CuTe
    DSL's JIT, 8-10 s of a job on the H200), untimed in every stage (check, warm-up); the package's
    own cache of compiled kernels on disk (FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED, keyed by its
    sources, the DSL's version and the compile options) is switched on unless the environment says
    otherwise, so that only the run's first job of a configuration compiles. Its output comes from
    torch's caching allocator, which hands back the same block every call once the first has
    allocated it."""

    def __init__(self, peer: Peer, configuration: Configuration = DENSE):
        super().__init__(peer, configuration)  # it takes grouped K/V heads as they are
        flash_attn_func = _flash_attn_cute().flash_attn_func
        major, minor = self.torch.cuda.get_device_capability()
        self.path = FLASH_ATTN_CUTE_PATHS.get(major)
        if self.path is None:
            raise PeerUnavailable(f"FlashAttention's CuTe DSL forward has no kernel for sm_{major}{minor}")
        self._flash_attn_func = flash_attn_func  # its softmax scale by default 1/sqrt(D), as attention's

    def _as_input(self, tensor):
        return tensor.transpose(1, 2).contiguous()  # [B, H, S, D] -> [B, S, H, D], a copy made once

    def _attend(self, q, k, v):
        out, _lse = self._flash_attn_func(q, k, v, causal=self.causal)
        return out.transpose(1, 2)  # back to [B, H, S, D] (a view)

    @property
    def identity(self) -> dict:
        return {"torch": self.torch.__version__, "flash_attn": installed_version("flash-attn-4"),
                "cutlass_dsl": installed_version("nvidia-cutlass-dsl"), "backend": self.peer.backend, "path": self.path}
