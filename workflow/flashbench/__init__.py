"""flashbench: compile, check, time and report the attention kernels of chapter G3.

Each stage is a small module usable without Snakemake; ``python -m flashbench`` is the command
line the Snakemake rules call.
"""


class FlashbenchError(Exception):
    """An error the user can act on: its message names the problem, no traceback is needed."""


class NoKernelForShape(FlashbenchError):
    """A library (a peer) has no implementation for this shape: that point is skipped, with this reason."""


from .api import flash_attention  # noqa: E402  (the function users call; it imports torch when called)
