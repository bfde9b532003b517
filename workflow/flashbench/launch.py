"""Load a kernel's cubin with CuPy and launch it as its contract says.

A contract with `tensor_maps` (the Hopper line) names the TMA tensor maps the kernel takes after its
six common parameters: they are encoded here (once per array address and shape, not per call) and
the kernel is launched with cuLaunchKernel, which can pass them (tensormap.py).

A contract with `persistent` (V18 on) is a persistent kernel: it is launched on grid
(min(ctas_per_sm * SMs, row tiles * heads), 1), the SM count read from the device, and takes the
logical grid (row tiles, heads), the grid a non-persistent kernel is launched on, as two int
parameters after its tensor maps; its blocks walk the row tiles * heads work tiles among themselves.

A contract with `tensor_map_rank` 4 (V25 on) takes its maps by head ([B][H][S][D]), so any S: its
logical grid is ceil((S + row_shift) / block_rows) row tiles (row_shift: the rows a causal ragged-first
entry places before row 0, else 0), and it takes the heads per batch H after B*H. One with
`causal` masks the keys after each query: it runs the causal configuration only. One with `work_list`
takes, after those, the list of work tiles each of its blocks walks (work_list.py), made here with its
parameter block. One with `ragged_first` has a second entry, launched with the same parameters where S's
last key tile holds 1 to `keys` keys (takes_ragged_first). One with `dtype` bf16 takes bf16 arrays (elements.py),
fp16 ones otherwise; one with `grouped_kv` takes K and V of H / kv_group heads, kv_group after the heads per
batch (every kernel by head takes kv_group after the heads per batch; only one with `grouped_kv` may be
given other than 1)."""
from __future__ import annotations

import collections
import math
import threading
from pathlib import Path

import numpy as np

from . import FlashbenchError, attention, elements
from .attention import LOG2E
from .compile import ENTRY
from .config import Configuration, Shape
from .occupancy import SMEM_WITHOUT_OPT_IN

MAX_GRID_Y = 65535  # gridDim.y limit: the grid's y is B*H
MAX_GROUPED_HEADS = 2**16  # V25's grouped build finds a K/V head by a multiply by ceil(2^32 / group), exact to this
PARAMS_KEPT = 256  # parameter blocks a kernel keeps (launch.params): a model's attention layers, each at its addresses
_params_lock = threading.Lock()  # the blocks' order is one thread's to change at a time
MAX_INT32 = 2**31 - 1  # a persistent kernel counts its work tiles and rows in int (at the sizes a GPU holds
                       # today the other kernels' int row offsets stay below it too)


class AttentionKernel:
    skips_unsupported = False  # a kernel must run every configured shape: one it cannot is a failed check

    def __init__(self, cubin: Path | str, record: dict, configuration: Configuration | None = None):
        """The kernel `cubin` its compile record describes; `configuration` (its run's) says what K/V heads its
        inputs have (none: one per query head)."""
        import cupy as cp

        self.cp = cp
        self.configuration = configuration
        self.name = record["kernel"]
        self.record = record
        self.cubin = Path(cubin)
        self.contract = record["launch"]
        self.module = cp.RawModule(path=str(cubin))
        self.function = self.module.get_function(ENTRY)
        ragged_first = self.contract.get("ragged_first")
        self.ragged_first_function = self.module.get_function(ragged_first["entry"]) if ragged_first else None
        self.dynamic_smem = self.contract["dynamic_smem_bytes"]
        if record["static_smem_bytes"] + self.dynamic_smem > SMEM_WITHOUT_OPT_IN:
            for function in (self.function, self.ragged_first_function):
                if function is not None:
                    function.max_dynamic_shared_size_bytes = self.dynamic_smem
        self._params = collections.OrderedDict()
        self._work_lists = {}

    def activate(self) -> None:
        """Nothing to set before this kernel's calls (a peer may have process-wide switches to set)."""

    @property
    def causal(self) -> bool:
        """Whether the kernel was built to mask the keys after each query."""
        return bool(self.contract.get("causal"))

    @property
    def dtype(self) -> str:
        """The element type of its Q, K, V and O: fp16, or bf16 (elements.py)."""
        return self.contract.get("dtype", "fp16")

    @property
    def by_head(self) -> bool:
        """Whether the kernel takes its tensor maps by head, and so any S (V25 on)."""
        return by_head(self.contract)

    def row_tiles(self, seq_len: int) -> int:
        """The logical grid's row tiles for S: whole ones, or for a kernel by head as many as cover S (for a
        causal one at an S its ragged-first entry takes, with the rows it places before row 0: row_shift)."""
        if not self.by_head:
            return seq_len // self.contract["block_rows"]
        return -(-(seq_len + row_shift(self.contract, seq_len)) // self.contract["block_rows"])

    def supports(self, shape: Shape) -> str | None:
        """Why the kernel cannot run `shape`, or None."""
        c = self.contract
        if shape.D != c["head_dim"]:
            return f"D={shape.D} but {self.name} is built for D={c['head_dim']}"
        for what in () if self.by_head else ("block_rows", "block_cols"):
            if shape.S % c[what]:
                return f"S={shape.S} is not a multiple of {self.name}'s {what} ({c[what]})"
        if self.persistent:
            if shape.B * shape.H * shape.S > MAX_INT32:
                return f"B*H*S={shape.B * shape.H * shape.S} rows are above the int32 {self.name} counts them in"
        elif shape.B * shape.H > MAX_GRID_Y:
            return f"B*H={shape.B * shape.H} is above the grid's limit of {MAX_GRID_Y} heads (gridDim.y)"
        return None

    @property
    def persistent(self) -> bool:
        """Whether the kernel walks its work tiles on a grid of its own size (V18 on)."""
        return "persistent" in self.contract

    @property
    def sm_count(self) -> int:
        """The device's number of SMs (the size of a persistent kernel's grid)."""
        if getattr(self, "_sm_count", None) is None:
            self._sm_count = int(self.cp.cuda.Device().attributes["MultiProcessorCount"])
        return self._sm_count

    def grid(self, row_tiles: int, heads: int) -> tuple[int, int]:
        """The grid a launch of the logical grid (row_tiles, heads) runs on: itself, or for a persistent
        kernel min(ctas_per_sm * SMs, work tiles) blocks (at least one: a wrong logical grid of no tiles
        is still launched, and the kernel's guard traps; one that walks a work list is refused before,
        as no list has a work tile to give it)."""
        if not self.persistent:
            return row_tiles, heads
        ctas = self.contract["persistent"]["ctas_per_sm"] * self.sm_count
        return max(1, min(ctas, row_tiles * heads)), 1

    @property
    def smallest_seq_len(self) -> int:
        """The shortest S the kernel takes: whole row tiles and whole key tiles, or one row by head."""
        return 1 if self.by_head else math.lcm(self.contract["block_rows"], self.contract["block_cols"])

    @property
    def identity(self) -> dict:
        """What the records name this implementation by."""
        return {"cubin_sha256": self.record["cubin_sha256"]}

    def inputs(self, shape: Shape, rng, kind: str = "normal") -> tuple:
        kv_heads = self.configuration.kv_heads(shape.H) if self.configuration else shape.H
        return attention.random_inputs(self.cp, shape, rng, kind, self.dtype, kv_heads)

    def __call__(self, q, k, v, o):
        """Attention of q, k, v into o; returns o. A shape the kernel cannot run is refused here, so
        nothing times or checks a partial grid."""
        B, H, S, D = q.shape
        kv_heads = k.shape[1] if k.ndim == 4 else 0
        for a in (q, k, v, o):
            if a.dtype != elements.storage(self.cp, self.dtype) or not a.flags.c_contiguous:
                raise FlashbenchError(f"q, k, v, o must be C-contiguous {self.dtype} arrays (elements.py)")
        if o.shape != q.shape or k.shape != v.shape or k.shape != (B, kv_heads, S, D) or kv_heads < 1 or H % kv_heads:
            raise FlashbenchError(f"q and o must be [B, H, S, D], k and v [B, H_kv, S, D] with H_kv dividing H: "
                                  f"{q.shape}, {k.shape}, {v.shape}, {o.shape}")
        if kv_heads != H and not self.contract.get("grouped_kv"):
            raise FlashbenchError(f"{self.name} takes K and V of one head per query head, not {kv_heads} for {H}")
        reason = self.supports(Shape(B, H, S, D))
        if reason:
            raise FlashbenchError(f"{self.name} cannot run this shape: {reason}")
        self.launch(self.row_tiles(S), B * H, q, k, v, o, S, heads_per_batch=H, kv_group=H // kv_heads)
        return o

    def capture(self, q, k, v, o, calls: int):
        """`calls` calls captured once into a CUDA graph; returns what replays it on the current stream.
        The launch's parameters (and a work list, which is copied to the GPU) are made before the capture."""
        cp = self.cp
        params = None
        if "tensor_maps" in self.contract:
            B, H, S, _ = q.shape
            params = self.params(q, k, v, o, S, B * H, self._scale_log2(None), heads_per_batch=H,
                                 kv_group=H // k.shape[1])
        stream = cp.cuda.Stream(non_blocking=True)
        with stream:
            stream.begin_capture()
            try:
                for _ in range(calls):
                    self(q, k, v, o)
            finally:
                graph = stream.end_capture()

        def replay():
            graph.launch(cp.cuda.get_current_stream())

        replay.params = params  # the graph reads the work list by address: it lives as long as the replay
        return replay

    def launch(self, row_tiles: int, heads: int, q, k, v, o, seq_len: int, scale: float | None = None,
               heads_per_batch: int | None = None, strides: dict | None = None, stream: int | None = None,
               kv_group: int = 1) -> None:
        """The raw launch of the logical grid (row_tiles, heads), no checks (tests use it to launch wrongly
        on purpose): that grid itself, or for a persistent kernel its own grid (`grid`) with row_tiles
        and heads as parameters. `scale`: the softmax scale, 1/sqrt(D) unless given. `heads_per_batch`:
        H of heads = B*H, for a kernel by head (all of them, B = 1, unless given). A kernel with tensor
        maps may be given an array's `strides` (params) and a `stream` (a handle: CuPy's current stream
        unless given); one with grouped K/V heads its `kv_group` (query heads per K/V head)."""
        scale_log2 = self._scale_log2(scale)
        if "tensor_maps" not in self.contract:
            args = (q, k, v, o, np.int32(seq_len), np.float32(scale_log2))
            if self.persistent:
                args += (np.int32(row_tiles), np.int32(heads))
            self.function(self.grid(row_tiles, heads), (self.contract["threads"],), args, shared_mem=self.dynamic_smem)
            return
        params = self.params(q, k, v, o, seq_len, heads, scale_log2, row_tiles, heads_per_batch, strides, kv_group)
        grid_x, grid_y = self.grid(row_tiles, heads)
        function = self.ragged_first_function if takes_ragged_first(self.contract, seq_len) else self.function
        if stream is None:
            stream = self.cp.cuda.get_current_stream().ptr
        self.cp.cuda.driver.launchKernel(function.kernel.ptr, grid_x, grid_y, 1, self.contract["threads"], 1, 1,
                                         self.dynamic_smem, stream, params.ptr, 0)

    def _scale_log2(self, scale: float | None) -> float:
        return (attention.softmax_scale(self.contract["head_dim"]) if scale is None else scale) * LOG2E

    def params(self, q, k, v, o, seq_len: int, heads: int, scale_log2: float, row_tiles: int | None = None,
               heads_per_batch: int | None = None, strides: dict | None = None, kv_group: int = 1):
        """The cuLaunchKernel parameter block of a kernel that takes tensor maps, cached per array
        addresses, shape, scale, strides and K/V group (PARAMS_KEPT of them, the least recently used let go
        first; one thread at a time): the timed loop, and a model's calls at the addresses its allocator
        gives each layer again, reuse it instead of encoding the maps per call. `row_tiles` (row_tiles(S)
        unless given) is passed to a persistent kernel only, `heads_per_batch` (`heads` unless given) to a
        kernel by head only, `kv_group` to a kernel with grouped K/V heads only, and a work list to a kernel
        that takes one. `strides`: an array's elements between consecutive b, h and s, by its name, where
        it is not C-contiguous (a kernel by head only)."""
        if row_tiles is None:
            row_tiles = self.row_tiles(seq_len)
        key = (*(_address(a) for a in (q, k, v, o)), seq_len, heads, scale_log2, row_tiles, heads_per_batch or heads)
        cache_key = (*key, kv_group, *sorted((strides or {}).items()))
        with _params_lock:
            params = self._params.get(cache_key)
            if params is None:
                params = _tensor_map_params(self.contract, *key, strides=strides, kv_group=kv_group,
                                            work_list=self._work_list(row_tiles, heads, heads_per_batch or heads,
                                                                      seq_len, kv_group))
                if len(self._params) >= PARAMS_KEPT:  # an old entry is only ever reused for equal arrays
                    self._params.popitem(last=False)
                self._params[cache_key] = params
            self._params.move_to_end(cache_key)  # the most recently used last
        return params

    def work_list_made(self, row_tiles: int, heads: int, heads_per_batch: int, seq_len: int, kv_group: int = 1
                       ) -> bool:
        """Whether a launch of this logical grid needs no work list copied to the GPU first (none taken,
        or made already): what a launch under a CUDA graph capture may not do."""
        return ("work_list" not in self.contract
                or (row_tiles, heads, heads_per_batch, seq_len, kv_group) in self._work_lists)

    def _work_list(self, row_tiles: int, heads: int, heads_per_batch: int, seq_len: int, kv_group: int = 1):
        """For a kernel that walks one, the work list (on the GPU) of the logical grid (row_tiles, heads),
        heads_per_batch a batch in groups of kv_group on a K/V head, at S = seq_len for this kernel's grid
        (work_list.py); else None. Made once and kept as long as the kernel: a CUDA graph captured on a
        launch reads it by address, whatever the parameter blocks' cache has let go since."""
        if "work_list" not in self.contract:
            return None
        key = (row_tiles, heads, heads_per_batch, seq_len, kv_group)
        if key not in self._work_lists:
            from .work_list import work_list

            c = self.contract
            blocks = self.grid(row_tiles, heads)[0]
            self._work_lists[key] = self.cp.asarray(work_list(row_tiles, heads, heads_per_batch, blocks, seq_len,
                                                              c["head_dim"], c["block_rows"], c["block_cols"],
                                                              self.causal, c["work_list"]["l2_section_bytes"],
                                                              kv_group=kv_group))
            self.cp.cuda.get_current_stream().synchronize()  # copied before a launch on another stream reads it
        return self._work_lists[key]


def _address(a) -> int:
    """Device address of a CuPy array, or the integer itself (tests pass raw addresses on purpose)."""
    data = getattr(a, "data", None)
    return int(data.ptr) if data is not None and hasattr(data, "ptr") else int(a)


def takes_ragged_first(contract: dict, seq_len: int) -> bool:
    """Whether a launch at S = seq_len goes to the contract's entry for an S ragged in its first keys (V25 on):
    one whose last key tile holds 1 to `keys` keys."""
    ragged_first = contract.get("ragged_first")
    return bool(ragged_first) and 0 < seq_len % contract["block_cols"] <= ragged_first["keys"]


def row_shift(contract: dict, seq_len: int) -> int:
    """The rows a causal kernel's ragged-first entry places before row 0 at S = seq_len (V25 on): the key tiles
    are laid out from S's end, so that the part tile is key tile 0, and the row tiles with them, Bc - S mod Bc
    rows on, so that rows and keys keep their places on the grid of whole tiles; 0 where another entry runs
    or there is no mask. Its row tiles cover S plus these rows (one more than S's at some S where the row
    tiles are 1.5 key tiles, V25 at D=64)."""
    causal_ragged = contract.get("causal") and takes_ragged_first(contract, seq_len)
    return contract["block_cols"] - seq_len % contract["block_cols"] if causal_ragged else 0


def by_head(contract: dict) -> bool:
    """Whether a launch contract's tensor maps are by head ([B][H][S][D]: any S), V25 on."""
    return contract.get("tensor_map_rank") == 4


def _tensor_map_params(contract: dict, q: int, k: int, v: int, o: int, seq_len: int, heads: int, scale_log2: float,
                       row_tiles: int | None = None, heads_per_batch: int | None = None, work_list=None,
                       strides: dict | None = None, kv_group: int = 1):
    """(q, k, v, o, seq_len, scale_log2, tensor maps in contract order[, row_tiles, heads[, H[,
    kv_group][, work list]]]) for cuLaunchKernel: the logical grid for a persistent contract only, which
    needs `row_tiles`, H and kv_group for one by head, which needs `heads_per_batch` (and `kv_group`
    other than 1 only where `grouped_kv`), and the work list's address for one with `work_list`, which
    needs `work_list` (an array on the GPU, or an address). Each map covers its array as the [heads * seq_len, head_dim] matrix of the
    contract's element type it is, or by head as [heads / H, H, seq_len, head_dim] (K and V with H /
    kv_group heads), with the contract's box; by head, `strides` may give an array's elements between
    consecutive b, h and s (by its name: q, k, v, o), where it is not C-contiguous."""
    import ctypes

    from . import tensormap

    arrays = {"q": q, "k": k, "v": v, "o": o}
    maps_by_head = by_head(contract)
    if maps_by_head and (heads_per_batch is None or heads % heads_per_batch):
        raise FlashbenchError(f"a kernel by head is passed its heads per batch, which divide the {heads} heads: "
                              f"{heads_per_batch} do not")
    if kv_group != 1 and not (contract.get("grouped_kv") and kv_group >= 1 and heads_per_batch % kv_group == 0):
        raise FlashbenchError(f"K/V heads in groups of {kv_group}: the kernel takes "
                              f"{'groups that divide the heads per batch' if contract.get('grouped_kv') else 'none'}")
    if contract.get("grouped_kv") and heads_per_batch > MAX_GROUPED_HEADS:
        raise FlashbenchError(f"{heads_per_batch} heads per batch: a kernel on grouped K/V heads works a K/V head out "
                              f"exactly for at most {MAX_GROUPED_HEADS}")
    data_type = tensormap.DATA_TYPES[contract.get("dtype", "fp16")]
    maps = []
    for spec in contract["tensor_maps"]:
        if spec["array"] not in arrays:
            raise FlashbenchError(f"the launch contract names a tensor map over {spec['array']!r}, not one of q, k, v, o")
        address, box = arrays[spec["array"]], tuple(spec["box"])
        if maps_by_head:
            array_heads = heads_per_batch // kv_group if spec["array"] in "kv" else heads_per_batch
            shape = (heads // heads_per_batch, array_heads, seq_len, contract["head_dim"])
            maps.append(tensormap.encode_by_head(address, shape, box, spec["swizzle"],
                                                 (strides or {}).get(spec["array"]), data_type))
        else:
            maps.append(tensormap.encode_tiled_2d(address, heads * seq_len, contract["head_dim"], box, spec["swizzle"],
                                                  data_type))
    common = (ctypes.c_uint64(q), ctypes.c_uint64(k), ctypes.c_uint64(v), ctypes.c_uint64(o), ctypes.c_int32(seq_len),
              ctypes.c_float(scale_log2))
    logical_grid = ()
    if "persistent" in contract:
        if row_tiles is None:
            raise FlashbenchError("a persistent kernel is passed its row tiles: none given")
        logical_grid = (ctypes.c_int32(row_tiles), ctypes.c_int32(heads))
        if maps_by_head:
            logical_grid += (ctypes.c_int32(heads_per_batch), ctypes.c_int32(kv_group))
    if "work_list" in contract:
        if work_list is None:
            raise FlashbenchError("a kernel that walks a work list is passed one: none given")
        logical_grid += (ctypes.c_uint64(_address(work_list)),)
    params = tensormap.Params(*common, *(m for m, _ in maps), *logical_grid)
    params.owners = [owner for _, owner in maps] + [work_list]  # the buffers the maps and the list live in
    return params
