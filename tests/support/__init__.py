"""Helpers shared by the test suite: datasets written in the test, servers on loopback, Hypothesis strategies.

Test modules import them as ``support.<module>``: ``tests/`` is on ``sys.path`` because ``tests/conftest.py``
is not in a package (pytest's default import mode puts its directory first). Child interpreters that run test
code get ``tests/`` on their ``PYTHONPATH`` or ``sys.path`` from the test that starts them.
"""
