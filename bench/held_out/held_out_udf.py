"""The keyed pandas function of bench/held_out/spread-udf.yaml (``function: held_out_udf:spread_bps``)."""

from __future__ import annotations

import pandas as pd


def spread_bps(quotes: pd.DataFrame) -> pd.DataFrame:
    """Each quote's symbol and spread in basis points of its mid price."""
    mid = (quotes["ask"] + quotes["bid"]) / 2.0
    return pd.DataFrame({"symbol": quotes["symbol"], "bps": (quotes["ask"] - quotes["bid"]) / mid * 10000.0})
