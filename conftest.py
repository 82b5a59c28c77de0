"""Doctests of modules whose optional dependency is missing are not collected.

``npydask.torch`` imports torch at the top (it is only ever imported
explicitly); where torch is not installed its doctests cannot run, and the
tests of the adapter skip in ``tests/test_torch.py``.
"""

from __future__ import annotations

import importlib.util

collect_ignore = [] if importlib.util.find_spec("torch") is not None else ["npydask/torch.py"]
