"""Test helpers for npydask and for code built on it.

:mod:`npydask.testing.strategies` holds hypothesis strategies (dtypes, shapes,
arrays, regions) and small file helpers; numpy is the oracle everywhere.
Importing this package needs ``hypothesis`` (the ``test`` extra).
"""
