"""Machinery the backends share: the file tail, retries, the event source over a stream, the
drill lock, the job's output.
"""

from __future__ import annotations

__all__: list[str] = []
