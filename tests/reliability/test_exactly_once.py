"""Exactly once: randomized finite reads each deliver every expected row exactly once per epoch.

A trial draws a reader configuration (reader kind, store, pool kind, workers, shards, seed, row-group and row
shuffling, drop partitions, epochs, predicate) from a fixed seed, so a failure is reproducible. A sharded trial
reads every shard: the epochs of each shard must each hold the shard's rows once, and the shards of one epoch
must be disjoint and together hold every row the predicate keeps. Every shard read counts as one read.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections import Counter

import pytest

from petastorm import make_batch_reader, make_reader
from petastorm.predicates import in_lambda, in_set
from reliability.helpers import SMALL_ROWS

#: reads over the three tests together.
TARGET_READS = 1000
#: makes the drawn configurations the same on every run.
SUITE_SEED = 20261129
POOL_WEIGHTS = {'dummy': 0.485, 'thread': 0.485, 'process': 0.03}
#: whether each kind of predicate keeps the row with a given id: both the reader's predicate and the expected ids
#: derive from it.
PREDICATE_KEEPS = {'set': lambda row_id: row_id % 4 == 1, 'lambda': lambda row_id: row_id % 3 != 0}


@dataclasses.dataclass(frozen=True)
class Trial:
    number: int
    reader: str  # 'rows' (make_reader) or 'batches' (make_batch_reader)
    store: str  # 'petastorm' or 'plain'
    pool: str
    workers: int
    shard_count: int | None
    seed: int | None
    shuffle_row_groups: bool
    shuffle_rows: bool
    drop_partitions: int
    num_epochs: int
    predicate: str | None  # None, 'set' or 'lambda'
    results_queue_size: int

    @property
    def reads(self) -> int:
        return self.shard_count or 1

    def expected_ids(self) -> set[int]:
        ids = set(range(SMALL_ROWS))
        if self.predicate is None:
            return ids
        keeps = PREDICATE_KEEPS[self.predicate]
        return {i for i in ids if keeps(i)}


def _draw(rng: random.Random, number: int) -> Trial:
    reader = rng.choice(['rows', 'batches'])
    pool = rng.choices(list(POOL_WEIGHTS), weights=list(POOL_WEIGHTS.values()))[0]
    # Every worker process is a fresh interpreter (seconds on a loaded machine): fewer of them per read.
    spawns = pool == 'process'
    return Trial(
        number=number, reader=reader,
        store='petastorm' if reader == 'rows' else rng.choice(['petastorm', 'plain']),
        pool=pool,
        workers=rng.randint(1, 2 if spawns else 4),
        shard_count=rng.choice([None, None, 2] if spawns else [None, None, None, 2, 3, 5]),
        seed=rng.choice([None, rng.randrange(2**31)]),
        shuffle_row_groups=rng.random() < 0.7, shuffle_rows=rng.random() < 0.5,
        drop_partitions=rng.choice([1, 1, 2, 3, 4]), num_epochs=rng.choice([1, 1, 2, 3]),
        predicate=rng.choice([None, None, 'set', 'lambda']), results_queue_size=rng.randint(1, 8))


def _trials() -> list[Trial]:
    rng = random.Random(SUITE_SEED)
    trials, reads = [], 0
    while reads < TARGET_READS:
        trial = _draw(rng, len(trials))
        trials.append(trial)
        reads += trial.reads
    return trials


def _predicate(kind: str | None):
    if kind == 'set':
        return in_set({i for i in range(SMALL_ROWS) if PREDICATE_KEEPS['set'](i)}, 'id')
    if kind == 'lambda':
        # The rule travels as state_arg so that in_lambda's state argument stays exercised.
        return in_lambda(['id'], lambda value, keeps: keeps(value), state_arg=PREDICATE_KEEPS['lambda'])
    return None


def _read_shard(trial: Trial, url: str, cur_shard: int | None) -> list[int]:
    factory = make_reader if trial.reader == 'rows' else make_batch_reader
    with factory(url, reader_pool_type=trial.pool, workers_count=trial.workers, seed=trial.seed,
                 shuffle_row_groups=trial.shuffle_row_groups, shuffle_rows=trial.shuffle_rows,
                 shuffle_row_drop_partitions=trial.drop_partitions, num_epochs=trial.num_epochs,
                 predicate=_predicate(trial.predicate), results_queue_size=trial.results_queue_size,
                 cur_shard=cur_shard, shard_count=trial.shard_count,
                 schema_fields=['id'] if trial.store == 'petastorm' else None) as reader:
        if trial.reader == 'rows':
            return [int(row.id) for row in reader]
        return [int(i) for batch in reader for i in batch.id]


def _check(trial: Trial, url: str) -> str | None:
    """Run one trial; return what went wrong, or None."""
    epochs_of_shards = []
    shards = [None] if trial.shard_count is None else list(range(trial.shard_count))
    for shard in shards:
        delivered = _read_shard(trial, url, shard)
        if len(delivered) % trial.num_epochs:
            return f'shard {shard}: {len(delivered)} rows is not a multiple of {trial.num_epochs} epochs'
        per_epoch = len(delivered) // trial.num_epochs
        epochs = [delivered[e * per_epoch:(e + 1) * per_epoch] for e in range(trial.num_epochs)]
        for e, rows in enumerate(epochs):
            repeated = [i for i, n in Counter(rows).items() if n > 1]
            if repeated:
                return f'shard {shard} epoch {e}: rows delivered twice: {sorted(repeated)[:10]}'
            if set(rows) != set(epochs[0]):
                return f'shard {shard} epoch {e}: rows differ from epoch 0'
        epochs_of_shards.append(set(epochs[0]))  # num_epochs >= 1: there is always an epoch 0
    union: Counter = Counter()
    for rows in epochs_of_shards:
        union.update(rows)
    expected = trial.expected_ids()
    missing = sorted(expected - set(union))
    extra = sorted(set(union) - expected)
    shared = sorted(i for i, n in union.items() if n > 1)
    if missing or extra or shared:
        return f'missing {missing[:10]} ({len(missing)}), unexpected {extra[:10]}, in two shards {shared[:10]}'
    return None


ALL_TRIALS = _trials()


def _param(trial: Trial):
    # Worker processes take seconds to start on a loaded machine.
    return pytest.param(trial, id=f'{trial.number}-{trial.pool}-{trial.reader}',
                        marks=[pytest.mark.slow] if trial.pool == 'process' else [])


@pytest.mark.parametrize('trial', [_param(t) for t in ALL_TRIALS])
def test_finite_read_delivers_each_expected_row_once(trial, small_dataset_url, plain_parquet_url, figures):
    url = small_dataset_url if trial.store == 'petastorm' else plain_parquet_url
    started = time.perf_counter()
    problem = _check(trial, url)
    figures.tally('exactly once (seeded randomized finite reads)', f'{trial.pool:>7} pool', reads=trial.reads,
                  trials=1, failures=int(problem is not None), seconds=time.perf_counter() - started)
    assert problem is None, f'{trial}: {problem}'


def test_the_trials_cover_the_option_space():
    assert sum(t.reads for t in ALL_TRIALS) >= TARGET_READS
    seen = {
        'pools': {t.pool for t in ALL_TRIALS}, 'readers': {t.reader for t in ALL_TRIALS},
        'stores': {t.store for t in ALL_TRIALS}, 'shards': {t.shard_count for t in ALL_TRIALS},
        'epochs': {t.num_epochs for t in ALL_TRIALS}, 'drop': {t.drop_partitions for t in ALL_TRIALS},
        'predicates': {t.predicate for t in ALL_TRIALS}, 'workers': {t.workers for t in ALL_TRIALS},
    }
    assert seen['pools'] == set(POOL_WEIGHTS)
    assert seen['readers'] == {'rows', 'batches'}
    assert seen['stores'] == {'petastorm', 'plain'}
    assert seen['shards'] == {None, 2, 3, 5}
    assert seen['epochs'] == {1, 2, 3}
    assert seen['drop'] == {1, 2, 3, 4}
    assert seen['predicates'] == {None, 'set', 'lambda'}
    assert seen['workers'] == {1, 2, 3, 4}
    process_reads = sum(t.reads for t in ALL_TRIALS if t.pool == 'process')
    assert process_reads >= 20
