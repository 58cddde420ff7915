"""A process pool with far more workers than the machine has cores logs one warning (workers_count stays 10 by
default, for compatibility)."""

from __future__ import annotations

import logging

# --- too many worker processes ------------------------------------------------------------------------------------

def test_process_pool_warns_once_when_workers_far_exceed_the_cores(monkeypatch, caplog):
    from petastorm.pools import process_pool

    started = []

    class _NoProcesses:
        def __init__(self, label, workers_count, *args):
            started.append(workers_count)

        def shutdown(self):
            pass

        def release(self):
            pass

    monkeypatch.setattr(process_pool, 'ProcessCore', _NoProcesses)
    monkeypatch.setattr(process_pool, 'usable_cores', lambda: 2)
    monkeypatch.setattr(process_pool, '_oversubscription_warned', False)
    with caplog.at_level(logging.WARNING, logger='petastorm'):
        process_pool.ProcessPool(4).start(len, None)  # twice the cores: fine
        assert not caplog.records
        process_pool.ProcessPool(10).start(len, None)
        process_pool.ProcessPool(10).start(len, None)
    assert started == [4, 10, 10]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, caplog.text
    message = warnings[0].getMessage()
    assert 'workers_count=10' in message
    assert '2 CPU cores' in message
    assert 'workers_count=2' in message


def test_oversubscription_threshold():
    from petastorm.pools.process_pool import oversubscribed

    assert not oversubscribed(10, 8)
    assert not oversubscribed(3, 1)
    assert oversubscribed(4, 1)
    assert oversubscribed(10, 2)
    assert not oversubscribed(4, 2)
