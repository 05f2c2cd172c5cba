"""User functions of the executor tests (imported by module path, as users' UDFs are)."""

import pandas as pd


def poison_13(df: pd.DataFrame) -> pd.DataFrame:
    """Raises on records whose value ends in 13 (mod 100): the dead-letter path."""
    if (df["value"] % 100 == 13).any():
        raise ValueError("value ends in 13")
    return df


def unchanged(df: pd.DataFrame) -> pd.DataFrame:
    """Every record as it came: a keyed pandas function whose input crosses whole wherever it is remote."""
    return df
