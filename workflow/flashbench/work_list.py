"""The work list a persistent kernel by head walks (V25 on): which work tiles each block takes, in order.

A work tile is one row tile of one head, named w = batch_head * row_tiles + row_tile. Under a causal
mask row tile r reads the key tiles up to its last row's only (0..r where Br = Bc), so the tiles differ
in length by up to S / Bc times, and a grid that deals them out in fixed rounds leaves some blocks with
far more work than others. The list is made here, where the whole of it can be seen:

    order     heads go in sections whose K and V fit in the kernel's share of L2 (`l2_section_bytes`;
              at least one K/V head, and so with grouped K/V heads the whole group that reads it), so
              that the blocks running at once read the same keys and values;
              inside a section, row tiles go from the last to the first, each over the section's
              heads: the longest first and the shortest at the end (the longest-processing-time rule)
    share     each work tile in that order goes to the block that frees first (ties to the lower
              block), by a cost of its key tiles plus one for its Q, epilogue and edges: what a
              dynamic scheduler's shared counter would hand out, without the counter

The kernel reads the list as `work_list` lays it out, in records of four int32 (16 bytes, one load):

    records 0 .. G-1   block b's first work tile: {row tile, head, batch, begin(b)}
    record G           {G, the work tiles, heads, begin(G)}: the grid, the count and the heads per
                       batch the list was made for
    records G+1 ..     each block's other work tiles, {row tile, head, batch, 0}, block after block:
                       block b's are records G + 1 + begin(b) .. G + begin(b + 1)

So a block reads its first work tile, how many it takes and what the list was made for in one round
trip, from places that need no other read first, and its work tiles name their head and batch
without a division.
"""
from __future__ import annotations

import heapq

import numpy as np

from . import FlashbenchError

TILE_OVERHEAD = 1  # a work tile's Q, epilogue and pipeline edges, in key tiles' time (the list's cost model)


def key_tiles(row_tile: int, seq_len: int, block_rows: int, block_cols: int, causal: bool) -> int:
    """Key tiles row tile `row_tile` reads: every one, or under the mask those up to its last row."""
    every = -(-seq_len // block_cols)
    return min(-(-(row_tile + 1) * block_rows // block_cols), every) if causal else every


def section_heads(batch_heads: int, kv_head_bytes: int, l2_section_bytes: int, kv_group: int = 1) -> int:
    """Heads per section: the query heads of as many K/V heads as have their K and V in `l2_section_bytes`
    (0: one), kv_group query heads a K/V head; 1 to batch_heads."""
    fit = l2_section_bytes // kv_head_bytes if l2_section_bytes else 1
    return int(min(max(fit, 1) * kv_group, batch_heads))


def order(row_tiles: int, batch_heads: int, heads_per_section: int) -> np.ndarray:
    """Every work tile once: sections of heads, in each the row tiles from the last, over its heads."""
    tiles = []
    for first in range(0, batch_heads, heads_per_section):
        section = np.arange(first, min(first + heads_per_section, batch_heads))
        rows = np.arange(row_tiles - 1, -1, -1)
        tiles.append((section[None, :] * row_tiles + rows[:, None]).ravel())  # row by row, over the heads
    return np.concatenate(tiles)


def share_out(tiles: np.ndarray, costs: np.ndarray, blocks: int) -> list[np.ndarray]:
    """Each of `tiles` in turn to the block that frees first, by `costs`; returns each block's tiles."""
    if np.all(costs == costs[0]):  # equal tiles: the blocks in turn, as the rule gives them
        return [tiles[b::blocks] for b in range(blocks)]
    return to_the_block_that_frees_first(tiles, costs, blocks)


def to_the_block_that_frees_first(tiles: np.ndarray, costs: np.ndarray, blocks: int) -> list[np.ndarray]:
    """share_out's rule, one tile at a time: a heap of the blocks by when each frees."""
    free = [(0, b) for b in range(blocks)]
    taken = [[] for _ in range(blocks)]
    for tile, cost in zip(tiles.tolist(), costs.tolist()):
        at, b = heapq.heappop(free)
        taken[b].append(tile)
        heapq.heappush(free, (at + cost, b))
    return [np.asarray(t, dtype=np.int64) for t in taken]


def work_list(row_tiles: int, batch_heads: int, heads: int, blocks: int, seq_len: int, head_dim: int,
              block_rows: int, block_cols: int, causal: bool, l2_section_bytes: int, element_bytes: int = 2,
              kv_group: int = 1) -> np.ndarray:
    """The int32 records the kernel reads (the module says how) for `blocks` blocks, of `batch_heads` heads
    in batches of `heads`, each `kv_group` consecutive heads on one K/V head."""
    if blocks < 1 or row_tiles < 1 or batch_heads < 1 or heads < 1 or batch_heads % heads:
        raise FlashbenchError(f"a work list needs a block, a work tile and batches of whole heads: {blocks} blocks, "
                              f"{row_tiles} row tiles, {batch_heads} heads in batches of {heads}")
    if row_tiles * batch_heads >= 2**31:
        raise FlashbenchError(f"{row_tiles * batch_heads} work tiles: above the int32 the kernel counts them in")
    if blocks > row_tiles * batch_heads:
        raise FlashbenchError(f"{blocks} blocks for {row_tiles * batch_heads} work tiles: a block would take none")
    kv_head_bytes = 2 * seq_len * head_dim * element_bytes
    tiles = order(row_tiles, batch_heads, section_heads(batch_heads, kv_head_bytes, l2_section_bytes, kv_group))
    length = np.array([key_tiles(r, seq_len, block_rows, block_cols, causal) + TILE_OVERHEAD for r in range(row_tiles)])
    per_block = share_out(tiles, length[tiles % row_tiles], blocks)
    begin = np.concatenate([[0], np.cumsum([len(t) - 1 for t in per_block])])
    firsts = np.array([t[0] for t in per_block])
    others = np.concatenate([t[1:] for t in per_block])
    records = np.concatenate([_records(firsts, row_tiles, heads, begin[:-1]),
                              [[blocks, row_tiles * batch_heads, heads, begin[-1]]],
                              _records(others, row_tiles, heads, np.zeros_like(others))])
    return records.astype(np.int32).ravel()


def _records(tiles: np.ndarray, row_tiles: int, heads: int, last: np.ndarray) -> np.ndarray:
    """Work tiles w = batch_head * row_tiles + row_tile as records {row tile, head, batch, `last`}."""
    batch_head = tiles // row_tiles
    return np.stack([tiles % row_tiles, batch_head % heads, batch_head // heads, last], axis=1)


def block_tiles(listed: np.ndarray, blocks: int, row_tiles: int, heads: int) -> list[np.ndarray]:
    """A list read back as the kernel reads it: each of `blocks` blocks' work tiles, as w."""
    records = listed.reshape(-1, 4)
    names = (records[:, 2] * heads + records[:, 1]) * row_tiles + records[:, 0]
    firsts, begin, others = names[:blocks], records[:blocks + 1, 3], names[blocks + 1:]
    return [np.concatenate([[firsts[b]], others[begin[b]:begin[b + 1]]]) for b in range(blocks)]
