"""PyTorch peers: the same check and timing as the kernels, on the same CuPy inputs (no copies).

torch is optional: without it every peer is skipped (PeerUnavailable) and the report says so.
"""
from __future__ import annotations

from . import FlashbenchError, NoKernelForShape, attention
from .config import Peer, Shape

# What torch says when SDPA, held to a backend, has no kernel for the inputs: the one error that
# makes a point skipped rather than the stage failed.
NO_KERNEL = "No available kernel"


class PeerUnavailable(FlashbenchError):
    """The peer cannot run here at all (no torch): skipped, not failed."""


def torch_version() -> str | None:
    """The installed torch's version, None where there is none (read from its metadata, not imported:
    the workflow asks as it loads)."""
    import importlib.metadata

    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def require_torch() -> None:
    """Raise PeerUnavailable where torch is not installed (asked once the GPU is known to be there)."""
    if torch_version() is None:
        raise PeerUnavailable("torch is not installed")


class TorchPeer:
    skips_unsupported = True  # above its max_seq_len a peer is not run, and says why

    def __init__(self, peer: Peer):
        try:
            import torch
            import torch.nn.functional as F
        except ImportError:
            raise PeerUnavailable("torch is not installed") from None
        import cupy as cp

        self.cp, self.torch, self.peer, self.name = cp, torch, peer, peer.name
        if torch.cuda.current_stream().cuda_stream != cp.cuda.get_current_stream().ptr:
            raise FlashbenchError("torch and CuPy are on different CUDA streams: the events would not time torch")
        self._tensors = {}  # CuPy array pointer -> the torch tensor over the same memory
        if peer.backend == "unfused":
            self._attend = lambda q, k, v: torch.softmax(
                (q @ k.transpose(-2, -1)) * attention.softmax_scale(q.shape[-1]), dim=-1) @ v
        else:
            # SDPA with automatic dispatch, or held to one backend by torch's process-wide switches,
            # set once here (one peer per process, as the pipeline runs them): the sdpa_kernel()
            # context around every call would add its own CPU time to calls timed back to back.
            switches = {"cudnn": torch.backends.cuda.enable_cudnn_sdp, "flash": torch.backends.cuda.enable_flash_sdp,
                        "efficient": torch.backends.cuda.enable_mem_efficient_sdp,
                        "math": torch.backends.cuda.enable_math_sdp}
            for backend, enable in switches.items():
                enable(peer.backend in ("auto", backend))
            self._attend = F.scaled_dot_product_attention

    @property
    def identity(self) -> dict:
        torch = self.torch
        return {"torch": torch.__version__, "cudnn": str(torch.backends.cudnn.version()), "backend": self.peer.backend}

    def supports(self, shape: Shape) -> str | None:
        if self.peer.max_seq_len and shape.S > self.peer.max_seq_len:
            return f"S={shape.S} is above {self.name}'s max_seq_len ({self.peer.max_seq_len})"
        return None

    def inputs(self, shape: Shape, rng, kind: str = "normal") -> tuple:
        self._tensors.clear()
        return attention.random_inputs(self.cp, shape, rng, kind)

    def _tensor(self, array):
        t = self._tensors.get(array.data.ptr)
        if t is None:
            t = self._tensors[array.data.ptr] = self.torch.from_dlpack(array)
        return t

    def __call__(self, q, k, v, o):
        """Attention of q, k, v; returns torch's own output (o is left alone: torch allocates). Only
        "no kernel for these inputs" is a skip; any other error (out of memory, a CUDA error) stops
        the stage with torch's message."""
        try:
            return self._attend(self._tensor(q), self._tensor(k), self._tensor(v))
        except RuntimeError as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            if NO_KERNEL in str(e):
                raise NoKernelForShape(f"torch has no {self.peer.backend} kernel for these inputs: {first}") from None
            raise FlashbenchError(f"torch failed running {self.name}: {first}") from None

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
