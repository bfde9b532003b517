"""The work list V25's blocks walk (work_list.py): every work tile once, the longest first in sections of
heads sized to L2, the blocks' loads even."""
import numpy as np
import pytest

from flashbench import FlashbenchError
from flashbench.work_list import (block_tiles, key_tiles, order, section_heads, share_out,
                                  to_the_block_that_frees_first, work_list)

BLOCKS = 132


def _listed(S, BH=64, causal=True, l2=32 << 20, blocks=BLOCKS, H=None):
    rows = -(-S // 128)
    H = H or BH
    return rows, block_tiles(work_list(rows, BH, H, blocks, S, 128, 128, 128, causal, l2), blocks, rows, H)


def _loads(rows, per_block, S, causal=True):
    return np.array([sum(key_tiles(int(w) % rows, S, 128, 128, causal) + 1 for w in tiles) for tiles in per_block])


@pytest.mark.parametrize("S", [1, 1000, 1024, 4000, 4096, 16384])
@pytest.mark.parametrize("causal", [False, True])
def test_every_work_tile_is_listed_once(S, causal):
    rows, per_block = _listed(S, BH=5 * 3, causal=causal, H=5, blocks=min(BLOCKS, -(-S // 128) * 15))
    listed = np.concatenate(per_block)
    assert sorted(listed.tolist()) == list(range(rows * 15))


def test_each_block_finds_its_first_work_tile_and_its_count_at_places_of_their_own():
    listed = work_list(8, 6 * 64, 64, BLOCKS, 1024, 128, 128, 128, True, 32 << 20)
    records = listed.reshape(-1, 4)
    assert listed.dtype == np.int32 and len(records) == 8 * 6 * 64 + 1
    assert records[BLOCKS].tolist() == [BLOCKS, 8 * 6 * 64, 64, 8 * 6 * 64 - BLOCKS]  # grid, count, heads: checked
    per_block = block_tiles(listed, BLOCKS, 8, 64)
    for b in (0, 7, BLOCKS - 1):
        first, w = records[b], per_block[b][0]
        assert first[:3].tolist() == [w % 8, (w // 8) % 64, w // (8 * 64)]  # row tile, head, batch
        assert records[b + 1, 3] - first[3] == len(per_block[b]) - 1  # how many more it takes


def test_causal_key_tiles_stop_at_the_diagonal_and_at_s():
    assert [key_tiles(r, 1000, 128, 128, True) for r in range(8)] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert [key_tiles(r, 1000, 128, 128, False) for r in (0, 7)] == [8, 8]
    assert key_tiles(0, 4096, 128, 64, True) == 2  # a 128-row tile reads two 64-key tiles up to its diagonal


@pytest.mark.parametrize("S", [4096, 8192, 16384])
def test_under_the_mask_the_most_loaded_block_is_within_1_percent_of_the_mean(S):
    rows, per_block = _listed(S)
    loads = _loads(rows, per_block, S)
    assert loads.max() <= 1.01 * loads.mean()


def test_sections_hold_the_heads_whose_k_and_v_fit_and_go_longest_first():
    assert section_heads(64, 2 * 4096 * 128 * 2, 32 << 20) == 16   # 2 MB of K and V a head at S = 4096
    assert section_heads(64, 2 * 16384 * 128 * 2, 32 << 20) == 4
    assert section_heads(64, 2 * 65536 * 128 * 2, 32 << 20) == 1   # a head above the section: one
    assert section_heads(3, 2 * 1024 * 128 * 2, 32 << 20) == 3     # never more than there are
    assert section_heads(64, 2 * 1024 * 128 * 2, 0) == 1           # 0: one head a section
    tiles = order(4, 6, 2)  # row tiles 3..0 over heads 0, 1, then over 2, 3, then 4, 5
    assert (tiles // 4).tolist() == [0, 1] * 4 + [2, 3] * 4 + [4, 5] * 4
    assert (tiles % 4).tolist()[:8] == [3, 3, 2, 2, 1, 1, 0, 0]


def test_without_the_mask_the_blocks_take_the_tiles_in_turn_head_by_head():
    rows, per_block = _listed(1024, causal=False, l2=0)
    head_by_head = order(8, 64, 1)  # head 0's row tiles 7..0, then head 1's, ...
    assert head_by_head[:9].tolist() == [7, 6, 5, 4, 3, 2, 1, 0, 15]
    for b in (0, 5, 131):
        assert per_block[b].tolist() == head_by_head[b::BLOCKS].tolist()
    assert max(map(len, per_block)) - min(map(len, per_block)) <= 1


def test_equal_tiles_go_to_the_blocks_in_turn_as_the_block_that_frees_first_would_take_them():
    tiles, costs = order(8, 64, 1), np.full(512, 9)
    in_turn, by_heap = share_out(tiles, costs, BLOCKS), to_the_block_that_frees_first(tiles, costs, BLOCKS)
    assert [t.tolist() for t in in_turn] == [t.tolist() for t in by_heap]


def test_a_list_refuses_what_the_kernel_cannot_name():
    with pytest.raises(FlashbenchError, match="work tile"):
        work_list(0, 64, 64, BLOCKS, 1, 128, 128, 128, True, 0)
    with pytest.raises(FlashbenchError, match="whole heads"):
        work_list(8, 64, 5, BLOCKS, 1024, 128, 128, 128, True, 0)
    with pytest.raises(FlashbenchError, match="int32"):
        work_list(2**24, 2**7, 2**7, BLOCKS, 2**31, 128, 128, 128, False, 0)
    with pytest.raises(FlashbenchError, match="would take none"):
        work_list(1, 5, 5, BLOCKS, 100, 128, 128, 128, False, 0)
