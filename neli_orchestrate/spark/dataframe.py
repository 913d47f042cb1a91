"""Parquet through the token commit guard: it lives in :mod:`neli_orchestrate.sinks.parquet`.

``write_parquet_fenced`` stays importable from here.
"""

from __future__ import annotations

from neli_orchestrate.sinks.parquet import write_parquet_fenced

__all__ = ["write_parquet_fenced"]
