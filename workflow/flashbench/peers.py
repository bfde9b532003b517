"""PyTorch peers: the same check and timing as the kernels, on the same CuPy inputs (no copies).

torch is optional: without it every peer is skipped (PeerUnavailable) and the report says so.
"""
from __future__ import annotations

from . import FlashbenchError, attention
from .config import Peer, Shape


class PeerUnavailable(FlashbenchError):
    """The peer cannot run here at all (no torch): skipped, not failed."""


class TorchPeer:
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
            scale = attention.SCALE
            self._attend = lambda q, k, v: torch.softmax((q @ k.transpose(-2, -1)) * scale, dim=-1) @ v
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

    def inputs(self, shape: Shape, rng) -> tuple:
        self._tensors.clear()
        return attention.random_inputs(self.cp, shape, rng)

    def _tensor(self, array):
        t = self._tensors.get(array.data.ptr)
        if t is None:
            t = self._tensors[array.data.ptr] = self.torch.from_dlpack(array)
        return t

    def __call__(self, q, k, v, o):
        """Attention of q, k, v; returns torch's own output (o is left alone: torch allocates)."""
        try:
            return self._attend(self._tensor(q), self._tensor(k), self._tensor(v))
        except RuntimeError as e:  # e.g. "No available kernel" for a backend held to a shape it lacks
            raise FlashbenchError(f"torch could not run {self.name}: {str(e).splitlines()[0]}") from None
