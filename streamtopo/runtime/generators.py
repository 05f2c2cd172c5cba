"""Built-in source generators: trades, quotes, words, sequence.

Replay after a crash must yield identical records, and a key group may resume on another executor from
nothing but its offset. So every field is a pure function of ``(seed, seq)``: a counter-based generator
(SplitMix64 applied to the record's sequence number) instead of a stateful RNG. Any slice of the
sequence can be regenerated independently, in any process, in vectorised numpy.

Event time is ``_ts = seq / rate_per_second``: the stream is generated in event time order, and the
source's watermark is simply the event time of the next record it will emit.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

_MASK = np.uint64(0xFFFFFFFFFFFFFFFF)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)

TICKERS = (
    "AAPL", "MSFT", "GOOG", "AMZN", "META", "NVDA", "TSLA", "IBM", "ORCL", "INTC",
    "AMD", "CSCO", "ADBE", "CRM", "NFLX", "QCOM",
)
VOCABULARY = (  # noqa: SIM905 - a paragraph reads better than 200 quoted words
    "the of and to a in is it you that he was for on are with as his they be at one have this from or had "
    "by hot word but what some we can out other were all there when up use your how said an each she "
    "which do their time if will way about many then them write would like so these her long make thing "
    "see him two has look more day could go come did number sound no most people my over know water than "
    "call first who may down side been now find any new work part take get place made live where after "
    "back little only round man year came show every good me give our under name very through just form "
    "sentence great think say help low line differ turn cause much mean before move right boy old too "
    "same tell does set three want air well also play small end put home read hand port large spell add "
    "even land here must big high such follow act why ask men change went light kind off need house "
    "picture try us again animal point mother world near build self earth father stream window key group"
).split()


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser (Steele et al. 2014), vectorised: a bijective, well-mixed hash of uint64."""
    with np.errstate(over="ignore"):
        z = (x.astype(np.uint64) + _GOLDEN) & _MASK
        z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK
        z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK
        return z ^ (z >> np.uint64(31))


def uniforms(seed: int, seq: np.ndarray, stream: int) -> np.ndarray:
    """Uniform [0, 1) floats, one per seq, independent across ``stream`` ids and seeds."""
    with np.errstate(over="ignore"):
        base = splitmix64(np.asarray([seed * 1_000_003 + stream], dtype=np.int64).astype(np.uint64))[0]
        h = splitmix64(seq.astype(np.uint64) ^ base)
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def names(pool: tuple[str, ...], count: int | None, prefix: str) -> np.ndarray:
    """``count`` distinct names: the pool's first ones, then synthetic ``prefix<i>`` beyond it."""
    n = count or len(pool)
    return np.array([pool[i] if i < len(pool) else f"{prefix}{i}" for i in range(n)], dtype=object)


def _symbols(seed: int, seq: np.ndarray, keys: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Symbol per record (uniform) and the symbol's index, the basis of its price level."""
    pool = names(TICKERS, keys, "SYM")
    idx = np.minimum((uniforms(seed, seq, 0) * len(pool)).astype(np.int64), len(pool) - 1)
    return pool[idx], idx


def _price_level(seed: int, idx: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """A per-symbol base price with a slow deterministic drift, so VWAP windows differ over time."""
    base = 20.0 + 480.0 * uniforms(seed, idx, 7)
    return base * (1.0 + 0.05 * np.sin(2 * np.pi * ts / 600.0 + idx))


def trades(seq: np.ndarray, ts: np.ndarray, seed: int, keys: int | None) -> pd.DataFrame:
    """Trades {symbol, price, volume}: the VWAP input of the COLA paper."""
    symbol, idx = _symbols(seed, seq, keys)
    price = _price_level(seed, idx, ts) * (1.0 + 0.004 * (uniforms(seed, seq, 1) - 0.5))
    volume = 1 + (uniforms(seed, seq, 2) * 1000).astype(np.int64)
    return pd.DataFrame({"symbol": symbol, "price": np.round(price, 4), "volume": volume})


def quotes(seq: np.ndarray, ts: np.ndarray, seed: int, keys: int | None) -> pd.DataFrame:
    """Quotes {symbol, bid, ask, volume}: bid below the drifting level, ask a small spread above."""
    symbol, idx = _symbols(seed, seq, keys)
    mid = _price_level(seed, idx, ts) * (1.0 + 0.004 * (uniforms(seed, seq, 1) - 0.5))
    spread = mid * (0.0002 + 0.001 * uniforms(seed, seq, 3))
    volume = 100 * (1 + (uniforms(seed, seq, 2) * 50).astype(np.int64))
    return pd.DataFrame(
        {"symbol": symbol, "bid": np.round(mid - spread / 2, 4), "ask": np.round(mid + spread / 2, 4),
         "volume": volume}
    )


ZIPF_EXPONENT = 1.1


def words(seq: np.ndarray, ts: np.ndarray, seed: int, keys: int | None) -> pd.DataFrame:
    """Words from a fixed vocabulary with Zipf(1.1) frequencies: a few hot keys, a long tail."""
    vocab = names(tuple(VOCABULARY), keys, "word")
    weights = 1.0 / np.arange(1, len(vocab) + 1) ** ZIPF_EXPONENT
    cdf = np.cumsum(weights) / weights.sum()
    idx = np.minimum(np.searchsorted(cdf, uniforms(seed, seq, 4), side="right"), len(vocab) - 1)
    return pd.DataFrame({"word": vocab[idx]})


def sequence(seq: np.ndarray, ts: np.ndarray, seed: int, keys: int | None) -> pd.DataFrame:
    """{seq, key, value}: key = seq % keys, value = seq; exact sums make loss or duplication visible."""
    seq = seq.astype(np.int64)
    return pd.DataFrame({"seq": seq, "key": seq % (keys or 1), "value": seq})


GENERATORS: dict[str, Callable[[np.ndarray, np.ndarray, int, int | None], pd.DataFrame]] = {
    "trades": trades,
    "quotes": quotes,
    "words": words,
    "sequence": sequence,
}


def generate(name: str, seq: np.ndarray, rate_per_second: float, seed: int = 0,
             keys: int | None = None) -> pd.DataFrame:
    """The records numbered ``seq`` of generator ``name``, with ``_ts = seq / rate_per_second``."""
    if name not in GENERATORS:
        raise ValueError(f"source.generator: unknown generator {name!r} (known: {', '.join(GENERATORS)})")
    seq = np.asarray(seq, dtype=np.int64)
    ts = seq / float(rate_per_second)
    frame = GENERATORS[name](seq, ts, seed, keys)
    frame["_ts"] = ts
    return frame
