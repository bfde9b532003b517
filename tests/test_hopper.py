"""The host side of the Hopper line without a GPU: which build runs where, the tensor-map arguments,
the cuLaunchKernel parameter block, and the launcher's refusals."""
import collections
import ctypes
import types

import pytest

from flashbench import FlashbenchError, launch, tensormap
from flashbench.attention import LOG2E, softmax_scale
from flashbench.compile import arch_flags, not_runnable_reason, runnable_build, runs_on
from flashbench.config import Shape
from flashbench.occupancy import blocks_per_sm

SCALE = softmax_scale(128)


def test_an_sm_90a_build_runs_on_sm_90_only():
    assert runs_on("sm_90a", "sm_90") and runs_on("sm_90", "sm_90")
    assert not runs_on("sm_90a", "sm_103") and not runs_on("sm_90", "sm_103") and not runs_on("sm_100a", "sm_90")
    assert runnable_build(["sm_90a"], "sm_90") == "sm_90a"
    assert runnable_build(["sm_90a", "sm_90"], "sm_90") == "sm_90"  # the GPU's own arch first
    assert runnable_build(["sm_90a"], "sm_103") is None
    reason = not_runnable_reason(["sm_90a"], "sm_103")
    assert reason.startswith("built for sm_90a only, not run on sm_103") and "tcgen05" in reason


def test_an_arch_specific_target_is_named_by_gencode():
    assert arch_flags("sm_90") == ["-arch=sm_90"]
    assert arch_flags("sm_90a") == ["-gencode=arch=compute_90a,code=sm_90a"]
    assert blocks_per_sm("sm_90a", 256, 168, 164920) == blocks_per_sm("sm_90", 256, 168, 164920)


def test_tiled_2d_args_put_the_innermost_dimension_first():
    a = tensormap.tiled_2d_args(0x7f0000000000, rows=64 * 1024, cols=128, box=(64, 128), swizzle=128)
    assert a["dims"] == (128, 64 * 1024) and a["strides"] == (256,) and a["box"] == (64, 128)
    assert a["data_type"] == 6 and a["swizzle"] == 3 and a["rank"] == 2 and a["element_strides"] == (1, 1)


@pytest.mark.parametrize("kwargs, message", [
    ({"box": (128, 128)}, "at most 128 bytes wide"),   # 256 bytes under a 128-byte swizzle
    ({"box": (64, 512)}, "1..256 per dimension"),
    ({"address": 0x1008}, "16-byte boundary"),
    ({"swizzle": 96}, "swizzle must be one of"),
    ({"rows": 64}, "larger than"),
])
def test_tiled_2d_args_refuse_what_the_driver_would(kwargs, message):
    args = {"address": 0x1000, "rows": 1024, "cols": 128, "box": (64, 128), "swizzle": 128, **kwargs}
    with pytest.raises(FlashbenchError, match=message):
        tensormap.tiled_2d_args(**args)


def test_by_head_args_give_s_a_bound_of_its_own():
    a = tensormap.by_head_args(0x7f0000000000, (2, 3, 1000, 128), box=(64, 128), swizzle=128)
    assert a["rank"] == 4 and a["dims"] == (128, 1000, 3, 2)  # {D, S, H, B}, innermost first
    assert a["strides"] == (256, 1000 * 256, 3 * 1000 * 256) and a["box"] == (64, 128, 1, 1)
    assert tensormap.by_head_args(0x1000, (1, 1, 1, 128), box=(64, 64), swizzle=128)["box"] == (64, 64, 1, 1)
    with pytest.raises(FlashbenchError, match="multiple of 16 bytes"):
        tensormap.by_head_args(0x1000, (1, 2, 3, 36), box=(32, 64), swizzle=128)  # rows of 72 bytes


def test_by_head_args_read_flash_attentions_layout_by_its_strides():
    # [B=2, S=1000, H=3, D=128] read as [B, H, S, D]: a row of S is H*D apart, a head D, a batch S*H*D
    a = tensormap.by_head_args(0x7f0000000000, (2, 3, 1000, 128), box=(64, 128), swizzle=128,
                               strides=(1000 * 3 * 128, 128, 3 * 128))
    assert a["dims"] == (128, 1000, 3, 2) and a["strides"] == (3 * 256, 256, 1000 * 3 * 256)
    with pytest.raises(FlashbenchError, match="multiple of 16 bytes"):  # a head 4 elements from the next
        tensormap.by_head_args(0x1000, (1, 2, 3, 128), box=(64, 64), swizzle=128, strides=(1000, 4, 256))


def test_a_tensor_map_is_128_bytes_at_a_64_byte_boundary():
    assert ctypes.sizeof(tensormap.TensorMap) == 128
    maps = [tensormap._aligned_tensor_map() for _ in range(8)]
    assert all(ctypes.addressof(m) % 64 == 0 for m, _ in maps)


CONTRACT = {"threads": 256, "block_rows": 128, "block_cols": 128, "dynamic_smem_bytes": 164920, "head_dim": 128,
            "tensor_maps": [{"array": a, "box": [64, 128], "swizzle": 128} for a in "qkv"]}


def _fake_encoder(calls):
    def encode(address, rows, cols, box, swizzle, data_type):
        calls.append((address, rows, cols, box, swizzle))
        m, owner = tensormap._aligned_tensor_map()
        m.opaque[0] = address  # recognisable bytes
        m.opaque[15] = rows
        return m, owner
    return encode


def test_the_parameter_block_points_at_each_argument_in_kernel_order(monkeypatch):
    calls = []
    monkeypatch.setattr(tensormap, "encode_tiled_2d", _fake_encoder(calls))
    q, k, v, o = 0x10000, 0x20000, 0x30000, 0x40000
    params = launch._tensor_map_params(CONTRACT, q, k, v, o, seq_len=1024, heads=6, scale_log2=SCALE * LOG2E)
    assert calls == [(a, 6 * 1024, 128, (64, 128), 128) for a in (q, k, v)]
    pointers = ctypes.cast(params.ptr, ctypes.POINTER(ctypes.c_void_p))

    def at(i, ctype):
        return ctypes.cast(pointers[i], ctypes.POINTER(ctype)).contents

    assert [at(i, ctypes.c_uint64).value for i in range(4)] == [q, k, v, o]
    assert at(4, ctypes.c_int32).value == 1024
    assert at(5, ctypes.c_float).value == pytest.approx(SCALE * LOG2E, rel=1e-6)
    for i, address in zip((6, 7, 8), (q, k, v)):
        m = at(i, tensormap.TensorMap)
        assert m.opaque[0] == address and m.opaque[15] == 6 * 1024
        assert pointers[i] % 64 == 0  # the map the driver copies is the aligned one


def test_a_contract_naming_an_unknown_array_is_an_error(monkeypatch):
    monkeypatch.setattr(tensormap, "encode_tiled_2d", _fake_encoder([]))
    bad = {**CONTRACT, "tensor_maps": [{"array": "x", "box": [64, 128], "swizzle": 128}]}
    with pytest.raises(FlashbenchError, match="tensor map over 'x'"):
        launch._tensor_map_params(bad, 1, 2, 3, 4, seq_len=128, heads=1, scale_log2=1.0)


class _Stub(launch.AttentionKernel):
    """An AttentionKernel without a module (no GPU here): only the host-side logic."""

    def __init__(self, contract):
        self.name, self.contract, self._params = "v14", contract, collections.OrderedDict()


def test_parameter_blocks_are_cached_per_arrays_and_shape(monkeypatch):
    calls = []
    monkeypatch.setattr(tensormap, "encode_tiled_2d", _fake_encoder(calls))
    kernel = _Stub(CONTRACT)
    first = kernel.params(0x10000, 0x20000, 0x30000, 0x40000, 1024, 64, 0.1275)
    assert kernel.params(0x10000, 0x20000, 0x30000, 0x40000, 1024, 64, 0.1275) is first and len(calls) == 3
    assert kernel.params(0x10000, 0x20000, 0x30000, 0x40000, 2048, 64, 0.1275) is not first and len(calls) == 6


def test_the_least_recently_used_parameter_block_is_let_go_first(monkeypatch):
    """A model's layers call at addresses of their own, in turn: as many as PARAMS_KEPT stay encoded."""
    calls = []
    monkeypatch.setattr(tensormap, "encode_tiled_2d", _fake_encoder(calls))
    kernel = _Stub(CONTRACT)
    layer = lambda i: (0x100000 * (i + 1), 0x100000 * (i + 1) + 0x40000, 0x100000 * (i + 1) + 0x80000,  # noqa: E731
                       0x100000 * (i + 1) + 0xC0000, 1024, 64, 0.1275)
    first = [kernel.params(*layer(i)) for i in range(launch.PARAMS_KEPT)]
    assert [kernel.params(*layer(i)) for i in range(launch.PARAMS_KEPT)] == first  # a second pass encodes nothing
    assert len(calls) == 3 * launch.PARAMS_KEPT
    kernel.params(*layer(0))  # layer 0 the most recently used: one more layer lets layer 1 go, not it
    kernel.params(*layer(launch.PARAMS_KEPT))
    assert kernel.params(*layer(0)) is first[0] and len(calls) == 3 * (launch.PARAMS_KEPT + 1)
    assert kernel.params(*layer(1)) is not first[1] and len(calls) == 3 * (launch.PARAMS_KEPT + 2)
    assert len(kernel._params) == launch.PARAMS_KEPT


def test_supports_refuses_more_heads_than_grid_y_allows():
    kernel = _Stub(CONTRACT)
    assert kernel.supports(Shape(1, 64, 1024, 128)) is None
    assert kernel.supports(Shape(1, 65535, 128, 128)) is None
    assert "65535" in kernel.supports(Shape(2, 40000, 128, 128))
    assert "multiple" in kernel.supports(Shape(1, 1, 192, 128))


# ---- persistent kernels (V18 on): their own grid, the logical grid as two trailing parameters ----------
BY_HEAD = {**CONTRACT, "threads": 384, "persistent": {"ctas_per_sm": 1}, "tensor_map_rank": 4,
           "tensor_maps": [{"array": a, "box": [64, 64 if a in "qo" else 128], "swizzle": 128} for a in "qkvo"]}


def test_a_kernel_by_head_takes_any_s_on_as_many_row_tiles_as_cover_it():
    kernel, whole = _Stub(BY_HEAD), _Stub(CONTRACT)
    assert kernel.by_head and not whole.by_head and not kernel.causal
    assert kernel.supports(Shape(1, 3, 1000, 128)) is None and kernel.supports(Shape(1, 1, 1, 128)) is None
    assert [kernel.row_tiles(S) for S in (1, 128, 129, 1000, 4096)] == [1, 1, 2, 8, 32]
    assert kernel.smallest_seq_len == 1 and whole.smallest_seq_len == 128 and whole.row_tiles(1024) == 8
    assert "D=64" in kernel.supports(Shape(1, 1, 1000, 64))
    assert _Stub({**BY_HEAD, "causal": True}).causal


def test_a_parameter_block_by_head_encodes_4d_maps_and_ends_with_the_heads_per_batch(monkeypatch):
    calls = []
    monkeypatch.setattr(tensormap, "encode_by_head", lambda address, shape, box, swizzle, strides, data_type: (
        calls.append((address, shape, box, strides)), tensormap._aligned_tensor_map())[1])
    q, k, v, o = 0x10000, 0x20000, 0x30000, 0x40000
    params = launch._tensor_map_params(BY_HEAD, q, k, v, o, seq_len=1000, heads=6, scale_log2=1.0, row_tiles=8,
                                       heads_per_batch=3, strides={"k": (1000 * 3 * 128, 128, 3 * 128)})
    assert calls == [(q, (2, 3, 1000, 128), (64, 64), None), (k, (2, 3, 1000, 128), (64, 128), (384000, 128, 384)),
                     (v, (2, 3, 1000, 128), (64, 128), None), (o, (2, 3, 1000, 128), (64, 64), None)]
    pointers = ctypes.cast(params.ptr, ctypes.POINTER(ctypes.c_void_p))
    assert len(params.values) == 14  # ..., row tiles, heads, heads per batch, K/V group
    assert [ctypes.cast(pointers[i], ctypes.POINTER(ctypes.c_int32)).contents.value for i in (10, 11, 12, 13)] == \
        [8, 6, 3, 1]
    with pytest.raises(FlashbenchError, match="heads per batch"):
        launch._tensor_map_params(BY_HEAD, q, k, v, o, seq_len=1000, heads=6, scale_log2=1.0, row_tiles=8,
                                  heads_per_batch=4)


def test_grouped_kv_heads_map_k_and_v_over_their_own_heads_and_pass_the_group_after_the_heads(monkeypatch):
    """A kernel with grouped K/V heads (V25 on) reads K and V of H / kv_group heads: their maps have
    that many heads, and kv_group follows the heads per batch. A bf16 build's maps are of bf16; a
    group the kernel does not take, or one that does not divide H, is refused."""
    calls = []
    monkeypatch.setattr(tensormap, "encode_by_head", lambda address, shape, box, swizzle, strides, data_type: (
        calls.append((address, shape, data_type)), tensormap._aligned_tensor_map())[1])
    grouped = {**BY_HEAD, "grouped_kv": True, "dtype": "bf16"}
    q, k, v, o = 0x10000, 0x20000, 0x30000, 0x40000
    params = launch._tensor_map_params(grouped, q, k, v, o, seq_len=1000, heads=16, scale_log2=1.0, row_tiles=8,
                                       heads_per_batch=8, kv_group=4)
    bf16 = tensormap.DATA_TYPES["bf16"]
    assert calls == [(q, (2, 8, 1000, 128), bf16), (k, (2, 2, 1000, 128), bf16), (v, (2, 2, 1000, 128), bf16),
                     (o, (2, 8, 1000, 128), bf16)]
    pointers = ctypes.cast(params.ptr, ctypes.POINTER(ctypes.c_void_p))
    assert len(params.values) == 14
    assert [ctypes.cast(pointers[i], ctypes.POINTER(ctypes.c_int32)).contents.value for i in (10, 11, 12, 13)] == \
        [8, 16, 8, 4]
    for contract, group in ((grouped, 3), (BY_HEAD, 2)):
        with pytest.raises(FlashbenchError, match="groups of"):
            launch._tensor_map_params(contract, q, k, v, o, seq_len=1000, heads=16, scale_log2=1.0, row_tiles=8,
                                      heads_per_batch=8, kv_group=group)
    with pytest.raises(FlashbenchError, match="works a K/V head out exactly for at most 65536"):
        launch._tensor_map_params(grouped, q, k, v, o, seq_len=1, heads=2**17, scale_log2=1.0, row_tiles=1,
                                  heads_per_batch=2**17, kv_group=2)


def test_a_kernel_that_walks_a_work_list_is_passed_its_address_last(monkeypatch):
    monkeypatch.setattr(tensormap, "encode_by_head", lambda *args: tensormap._aligned_tensor_map())
    listed = {**BY_HEAD, "work_list": {"l2_section_bytes": 0}}
    params = launch._tensor_map_params(listed, 0x10000, 0x20000, 0x30000, 0x40000, seq_len=1000, heads=6,
                                       scale_log2=1.0, row_tiles=8, heads_per_batch=3, work_list=0x50000)
    pointers = ctypes.cast(params.ptr, ctypes.POINTER(ctypes.c_void_p))
    assert len(params.values) == 15
    assert ctypes.cast(pointers[14], ctypes.POINTER(ctypes.c_uint64)).contents.value == 0x50000
    with pytest.raises(FlashbenchError, match="work list"):
        launch._tensor_map_params(listed, 1 << 16, 2 << 16, 3 << 16, 4 << 16, seq_len=1000, heads=6, scale_log2=1.0,
                                  row_tiles=8, heads_per_batch=3)
PERSISTENT = {**CONTRACT, "threads": 384, "persistent": {"ctas_per_sm": 1}}


def _persistent_stub(sm_count=132, contract=PERSISTENT):
    kernel = _Stub(contract)
    kernel._sm_count = sm_count
    return kernel


def test_a_persistent_kernel_gets_one_block_per_sm_or_one_per_work_tile():
    kernel = _persistent_stub()
    assert kernel.persistent and not _Stub(CONTRACT).persistent
    assert kernel.grid(8, 64) == (132, 1)      # the case: 512 work tiles on 132 SMs
    assert kernel.grid(2, 5) == (10, 1)        # fewer tiles than SMs: one block each
    assert kernel.grid(0, 1) == (1, 1)         # no tiles at all is still launched: the kernel's guard traps
    assert _persistent_stub(contract={**PERSISTENT, "persistent": {"ctas_per_sm": 2}}).grid(8, 64) == (264, 1)
    assert _Stub(CONTRACT).grid(8, 64) == (8, 64)  # a non-persistent kernel: the logical grid itself


def test_a_persistent_parameter_block_ends_with_the_logical_grid(monkeypatch):
    monkeypatch.setattr(tensormap, "encode_tiled_2d", _fake_encoder([]))
    params = launch._tensor_map_params(PERSISTENT, 0x10000, 0x20000, 0x30000, 0x40000, seq_len=1024, heads=6,
                                       scale_log2=1.0, row_tiles=8)
    pointers = ctypes.cast(params.ptr, ctypes.POINTER(ctypes.c_void_p))
    assert len(params.values) == 11
    assert [ctypes.cast(pointers[i], ctypes.POINTER(ctypes.c_int32)).contents.value for i in (9, 10)] == [8, 6]
    # a non-persistent contract takes no more than its nine parameters, whatever row_tiles says
    assert len(launch._tensor_map_params(CONTRACT, 1 << 16, 2 << 16, 3 << 16, 4 << 16, seq_len=1024, heads=6,
                                         scale_log2=1.0, row_tiles=8).values) == 9
    with pytest.raises(FlashbenchError, match="row tiles"):
        launch._tensor_map_params(PERSISTENT, 1, 2, 3, 4, seq_len=1024, heads=6, scale_log2=1.0)


def test_persistent_parameter_blocks_are_cached_per_logical_grid(monkeypatch):
    monkeypatch.setattr(tensormap, "encode_tiled_2d", _fake_encoder([]))
    kernel = _persistent_stub()
    first = kernel.params(0x10000, 0x20000, 0x30000, 0x40000, 1024, 64, 0.1275)
    assert kernel.params(0x10000, 0x20000, 0x30000, 0x40000, 1024, 64, 0.1275, row_tiles=8) is first  # S / 128
    short = kernel.params(0x10000, 0x20000, 0x30000, 0x40000, 1024, 64, 0.1275, row_tiles=7)
    assert short is not first and ctypes.cast(short.pointers[9], ctypes.POINTER(ctypes.c_int32)).contents.value == 7


class _FakeCupy:
    """Just what AttentionKernel.launch touches of CuPy, recording cuLaunchKernel's arguments."""

    def __init__(self):
        self.launches = []
        fake = self

        class driver:
            @staticmethod
            def launchKernel(fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
                fake.launches.append(((gx, gy, gz), (bx, by, bz), smem, params))

        class stream:
            ptr = 0

        class cuda:
            pass

        cuda.driver = driver
        cuda.get_current_stream = staticmethod(lambda: stream)
        self.cuda = cuda


def test_a_persistent_launch_passes_a_short_logical_grid_on_to_the_kernel(monkeypatch):
    """The mislaunch the GPU tests make (one row tile short) reaches a persistent kernel as its
    row_tiles parameter, on a grid of its own size: its guard (row_tiles * block_rows != S) traps."""
    monkeypatch.setattr(tensormap, "encode_tiled_2d", _fake_encoder([]))
    kernel = _persistent_stub()
    kernel.cp, kernel.dynamic_smem = _FakeCupy(), 230512
    kernel.function = type("F", (), {"kernel": type("K", (), {"ptr": 0})()})()
    kernel.launch(1024 // 128, 64, 0x10000, 0x20000, 0x30000, 0x40000, 1024)
    kernel.launch(1024 // 128 - 1, 1, 0x10000, 0x20000, 0x30000, 0x40000, 1024)
    (grid, block, smem, params), (short_grid, _, _, short_params) = kernel.cp.launches
    assert grid == (132, 1, 1) and block == (384, 1, 1) and smem == 230512 and short_grid == (7, 1, 1)

    def logical(params_ptr):
        pointers = ctypes.cast(params_ptr, ctypes.POINTER(ctypes.c_void_p))
        return [ctypes.cast(pointers[i], ctypes.POINTER(ctypes.c_int32)).contents.value for i in (9, 10)]

    assert logical(params) == [8, 64] and logical(short_params) == [7, 1]


def test_a_persistent_kernel_is_not_held_to_the_grid_y_limit():
    kernel = _persistent_stub()
    assert kernel.supports(Shape(2, 40000, 128, 128)) is None  # its grid's y is 1
    assert "int32" in kernel.supports(Shape(64, 1024, 32768, 128))  # 2^31 rows
    assert "multiple" in kernel.supports(Shape(1, 1, 192, 128))  # whole tiles, as for every kernel


def test_a_launch_takes_the_ragged_first_entry_where_the_last_key_tile_holds_few_keys():
    """A contract with ragged_first (V25): an S whose last key tile holds 1 to `keys` keys goes to that
    entry, every other S (whole tiles among them) to the first; a contract without it, always the first."""
    contract = {**BY_HEAD, "block_cols": 128, "ragged_first": {"entry": "flash_attention_forward_ragged_first", "keys": 32}}
    taken = {S: launch.takes_ragged_first(contract, S) for S in (1, 32, 33, 127, 128, 129, 160, 161, 1000, 1050, 4000, 4096)}
    assert taken == {1: True, 32: True, 33: False, 127: False, 128: False, 129: True, 160: True, 161: False,
                     1000: False, 1050: True, 4000: True, 4096: False}
    assert not any(launch.takes_ragged_first({**BY_HEAD, "block_cols": 128}, S) for S in (1, 4000))


def test_a_causal_ragged_first_launch_covers_the_rows_it_places_before_row_0():
    """Under the mask the ragged-first entry's row tiles start Bc - S mod Bc rows before row 0. Where Bc
    divides Br (D=128, 256) that changes no count; at Br = 1.5 Bc (D=64: 192 and 128) it adds a row tile
    at some S, which the launch must pass (the kernel traps on any other count)."""
    ragged = {"entry": "flash_attention_forward_ragged_first", "keys": 32}
    d64 = {**BY_HEAD, "block_rows": 192, "block_cols": 128, "ragged_first": ragged}
    causal_d64, causal_d256 = _Stub({**d64, "causal": True}), _Stub({**d64, "block_rows": 128, "block_cols": 64, "causal": True})
    assert [launch.row_shift(causal_d64.contract, S) for S in (1, 32, 33, 128, 130, 1000, 4000)] == [127, 96, 0, 0, 126, 0, 96]
    assert launch.row_shift(d64, 130) == 0  # without the mask no row moves
    for S in range(1, 1200):
        grid_rows = 128 * -(-S // 128) if 0 < S % 128 <= 32 else S  # rows from row tile 0's first to S's end
        assert causal_d64.row_tiles(S) == -(-grid_rows // 192), S
        assert _Stub(d64).row_tiles(S) == -(-S // 192) and causal_d256.row_tiles(S) == -(-S // 128), S
    assert (causal_d64.row_tiles(130), _Stub(d64).row_tiles(130)) == (2, 1)  # rows -126 .. 129: two row tiles


def test_a_work_list_is_made_once_per_logical_grid_and_kept_while_parameter_blocks_come_and_go(monkeypatch):
    """A CUDA graph captured on a launch reads the work list by address: it must outlive the parameter
    blocks' cache, which lets entries go after 16 shapes. A launch may be given its stream and the
    arrays' strides (flash_attention: torch's stream, FlashAttention's layout)."""
    encoded, made, streams = [], [], []
    monkeypatch.setattr(tensormap, "encode_by_head", lambda address, shape, box, swizzle, strides, data_type: (
        encoded.append(strides), tensormap._aligned_tensor_map())[1])
    kernel = _persistent_stub(contract={**BY_HEAD, "work_list": {"l2_section_bytes": 16 << 20}})
    kernel._work_lists, kernel.dynamic_smem = {}, 0
    kernel.function = type("F", (), {"kernel": type("K", (), {"ptr": 0})()})()
    current = type("Stream", (), {"ptr": 0x1, "synchronize": staticmethod(lambda: None)})
    kernel.cp = types.SimpleNamespace(
        asarray=lambda a: made.append(types.SimpleNamespace(data=types.SimpleNamespace(ptr=0x50000 + len(made))))
        or made[-1],
        cuda=types.SimpleNamespace(get_current_stream=lambda: current, driver=types.SimpleNamespace(
            launchKernel=lambda fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra: streams.append(stream))))
    assert not kernel.work_list_made(8, 6, 3, 1000)
    for S in range(1000, 1000 + 17):  # 17 shapes: the cache let the first one's block go
        kernel.launch(8, 6, 0x10000, 0x20000, 0x30000, 0x40000, S, heads_per_batch=3)
    assert len(made) == 17 and kernel.work_list_made(8, 6, 3, 1000) and streams == [0x1] * 17
    kernel.launch(8, 6, 0x10000, 0x20000, 0x30000, 0x40000, 1000, heads_per_batch=3, stream=0x5EED,
                  strides={"q": (1000 * 3 * 128, 128, 3 * 128)})
    assert len(made) == 17 and kernel._work_list(8, 6, 3, 1000) is made[0]  # made again: never
    assert streams[-1] == 0x5EED and encoded[-4:] == [(384000, 128, 384), None, None, None]
