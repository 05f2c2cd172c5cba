"""Spark's ``hash()`` (``Murmur3Hash``: Murmur3_x86_32, seed 42) in vectorised numpy, bit for bit.

Key groups are ``pmod(hash(key), K)`` (runtime/partitioning.py routes records by it); a source partitioned
by key (planner/source_layout.py) needs the same hash to know which seqs each key group generates, here
where the planner and the controller can use it without Spark or Arrow.
"""

from __future__ import annotations

import numpy as np

SEED = 42
"""Murmur3Hash's seed in Spark's hash()."""

# numpy uint32 arithmetic wraps modulo 2**32 exactly as Java's int does, so no explicit masking is
# needed; the bit patterns are Java's, read unsigned.

_C1, _C2 = np.uint32(0xCC9E2D51), np.uint32(0x1B873593)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _mix_k1(k1: np.ndarray) -> np.ndarray:
    return _rotl(k1 * _C1, 15) * _C2


def _mix_h1(h1: np.ndarray, k1: np.ndarray) -> np.ndarray:
    return _rotl(h1 ^ k1, 13) * np.uint32(5) + np.uint32(0xE6546B64)


def _fmix(h1: np.ndarray, length: np.ndarray | int) -> np.ndarray:
    h1 = h1 ^ np.asarray(length, dtype=np.uint32)
    h1 = (h1 ^ (h1 >> np.uint32(16))) * np.uint32(0x85EBCA6B)
    h1 = (h1 ^ (h1 >> np.uint32(13))) * np.uint32(0xC2B2AE35)
    mixed: np.ndarray = h1 ^ (h1 >> np.uint32(16))
    return mixed


def hash_doubles(values: np.ndarray, h: np.ndarray) -> np.ndarray:
    """Spark's hash of a double column with per-row seeds ``h``: ``hashLong(doubleToLongBits(v))``,
    low word then high word; -0.0 hashed as 0.0; NaN (null) rows keep their seed."""
    bits = (values + 0.0).view(np.uint64)  # -0.0 + 0.0 == +0.0
    low = (bits & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    high = (bits >> np.uint64(32)).astype(np.uint32)
    hashed = _fmix(_mix_h1(_mix_h1(h, _mix_k1(low)), _mix_k1(high)), 8)
    return np.where(np.isnan(values), h, hashed)


def hash_bytes(flat: np.ndarray, starts: np.ndarray, lengths: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """Spark's ``Murmur3_x86_32.hashUnsafeBytes`` of many byte strings at once (``flat[start:start+length]``
    each, ``flat`` padded by 3 zero bytes): 4-byte little-endian words, then each remaining byte mixed
    alone as a sign-extended int (Spark's legacy variant, not the reference Murmur3 tail), then fmix
    with the byte length. Loops over word positions, never over strings."""
    h = seeds.astype(np.uint32, copy=True)
    flat32 = flat.astype(np.uint32)
    words = lengths // 4
    for j in range(int(words.max(initial=0))):
        rows = np.flatnonzero(words > j)
        p = starts[rows] + 4 * j
        word = (
            flat32[p]
            | (flat32[p + 1] << np.uint32(8))
            | (flat32[p + 2] << np.uint32(16))
            | (flat32[p + 3] << np.uint32(24))
        )
        h[rows] = _mix_h1(h[rows], _mix_k1(word))
    signed = flat.view(np.int8).astype(np.int32).view(np.uint32)
    for t in range(3):
        rows = np.flatnonzero(lengths % 4 > t)
        h[rows] = _mix_h1(h[rows], _mix_k1(signed[starts[rows] + 4 * words[rows] + t]))
    return _fmix(h, lengths.astype(np.uint32))


def key_groups_of_numbers(values: np.ndarray, k: int) -> np.ndarray:
    """``pmod(hash(CAST(v AS DOUBLE)), k)`` of numeric keys, one column (int32): the key group a record
    with that key is routed to (every numeric key is hashed as a double, runtime/partitioning.py)."""
    hashed = hash_doubles(values.astype(np.float64), np.full(len(values), SEED, dtype=np.uint32))
    return np.mod(hashed.view(np.int32), np.int32(k))
