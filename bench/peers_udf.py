"""The keyed pandas function of bench/peers.py's ``udf`` shape, as streamtopo's executors import it
(``function: peers_udf:tenths``, found through ``STREAMTOPO_UDF_PATH``). PyFlink and Structured Streaming
run the same function as their pandas UDFs (bench/peers_worker.py's :func:`tenths`)."""

from __future__ import annotations

import pandas as pd


def tenths(records: pd.DataFrame) -> pd.DataFrame:
    """The records with ``r = value % 10``, computed by pandas."""
    return records.assign(r=records["value"] % 10)
