"""What a result looks like: the terminal block, the report files, the pictures and the
diagnoses.
"""

from __future__ import annotations

__all__: list[str] = []
