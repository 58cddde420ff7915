"""The combining predicates Petastorm's users rely on: ``in_intersection``, ``in_negate`` and ``in_reduce``.

Each is checked as the readers call it (``do_include`` with one row's values for ``make_reader``'s per-row
contract, with a pandas DataFrame for ``make_batch_reader``'s, ``evaluate`` over decoded columns) and through a
real reader over a small dataset written by our writer.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from petastorm import make_batch_reader, make_reader
from petastorm.predicates import in_intersection, in_lambda, in_negate, in_reduce, in_set
from petastorm.unischema import Unischema, UnischemaField
from petastorm.writer import write_dataset

SCHEMA = Unischema('TaggedSchema', [
    UnischemaField('id', np.int32, (), None, False),
    UnischemaField('tags', np.int32, (None,), None, False),
])
TAGS = {0: [1, 2], 1: [], 2: [3], 3: [2, 3, 4], 4: [5], 5: [1, 5]}


@pytest.fixture(scope='module')
def tagged_url(tmp_path_factory):
    url = tmp_path_factory.mktemp('tagged').as_uri()
    write_dataset(url, SCHEMA, [{'id': i, 'tags': np.array(tags, dtype=np.int32)} for i, tags in TAGS.items()],
                  row_group_size_mb=0.0001, progress=False)
    return url


def _ids(url, predicate):
    with make_reader(url, predicate=predicate, reader_pool_type='dummy', shuffle_row_groups=False) as reader:
        return sorted(int(row.id) for row in reader)


def _batch_ids(url, predicate):
    with make_batch_reader(url, predicate=predicate, reader_pool_type='dummy', shuffle_row_groups=False) as reader:
        return sorted(int(i) for batch in reader for i in batch.id)


# -- in_intersection ---------------------------------------------------------------------------------------------

def test_in_intersection_keeps_rows_sharing_an_element():
    predicate = in_intersection([2, 7], 'tags')
    assert predicate.get_fields() == {'tags'}
    assert predicate.do_include({'tags': [1, 2]}) is True
    assert predicate.do_include({'tags': np.array([7], dtype=np.int64)}) is True
    assert predicate.do_include({'tags': (3, 4)}) is False
    assert predicate.do_include({'tags': []}) is False


def test_in_intersection_refuses_a_value_that_is_not_iterable():
    with pytest.raises(ValueError, match='Predicate field should have iterable type'):
        in_intersection([2], 'tags').do_include({'tags': 2})


def test_in_intersection_evaluates_a_batch_row_by_row():
    tags = np.empty(3, dtype=object)
    tags[:] = [np.array([1, 2]), np.array([], dtype=np.int64), np.array([3])]
    mask = in_intersection([3, 1], 'tags').evaluate({'tags': tags}, 3)
    assert mask.tolist() == [True, False, True]


def test_in_intersection_in_make_reader(tagged_url):
    assert _ids(tagged_url, in_intersection([2, 5], 'tags')) == [0, 3, 4, 5]


# -- in_negate ---------------------------------------------------------------------------------------------------

def test_in_negate_inverts_a_row_answer_and_keeps_the_fields():
    inner = in_lambda(['id'], lambda value: value > 2)
    predicate = in_negate(inner)
    assert predicate.get_fields() == ['id']
    assert predicate.do_include({'id': 1}) is True
    assert predicate.do_include({'id': 3}) is False
    assert predicate.vectorized is False


def test_in_negate_inverts_a_batch_element_wise():
    predicate = in_negate(in_set({1, 3}, 'id'))
    assert predicate.vectorized is True
    frame = pd.DataFrame({'id': [0, 1, 2, 3]})
    assert predicate.do_include(frame).tolist() == [True, False, True, False]
    assert predicate.evaluate({'id': np.arange(4)}, 4).tolist() == [True, False, True, False]


def test_in_negate_refuses_what_is_not_a_predicate():
    with pytest.raises(ValueError, match='PredicateBase'):
        in_negate(lambda row: True)


def test_in_negate_in_both_readers(tagged_url):
    predicate = in_negate(in_set({0, 2, 4}, 'id'))
    assert _ids(tagged_url, predicate) == [1, 3, 5]
    assert _batch_ids(tagged_url, predicate) == [1, 3, 5]
    assert _ids(tagged_url, in_negate(in_intersection([2, 5], 'tags'))) == [1, 2]


# -- in_reduce ---------------------------------------------------------------------------------------------------

def test_in_reduce_combines_the_answers_with_the_function():
    low = in_lambda(['id'], lambda value: value < 3)
    odd = in_lambda(['id'], lambda value: value % 2 == 1)
    assert in_reduce([low, odd], all).get_fields() == {'id'}
    assert [in_reduce([low, odd], all).do_include({'id': i}) for i in range(5)] == [False, True, False, False, False]
    assert [in_reduce([low, odd], any).do_include({'id': i}) for i in range(5)] == [True, True, True, True, False]
    exactly_one = in_reduce([low, odd], lambda answers: sum(answers) == 1)
    assert [exactly_one.do_include({'id': i}) for i in range(5)] == [True, False, True, True, False]


def test_in_reduce_reads_the_fields_of_every_predicate():
    predicate = in_reduce([in_set({1}, 'id'), in_intersection([2], 'tags')], any)
    assert predicate.get_fields() == {'id', 'tags'}


def test_in_reduce_evaluates_a_batch_like_its_rows():
    columns = {'id': np.arange(6)}
    low, odd = in_set({0, 1, 2}, 'id'), in_set({1, 3, 5}, 'id')
    lazy_odd = in_lambda(['id'], lambda value: value % 2 == 1)
    for reduce_func in (all, any, lambda answers: sum(answers) == 1):
        for predicates in ([low, odd], [low, lazy_odd]):
            combined = in_reduce(predicates, reduce_func)
            expected = [bool(combined.do_include({'id': i})) for i in range(6)]
            assert combined.evaluate(columns, 6).tolist() == expected
    assert in_reduce([low, odd], all).vectorized is True
    assert in_reduce([low, lazy_odd], all).vectorized is False
    assert in_reduce([low, odd], lambda answers: all(answers)).vectorized is False


@pytest.mark.parametrize('reduce_func', [all, any, lambda answers: len(answers) == 0])
def test_in_reduce_of_no_predicates_answers_as_its_function_does_for_no_answers(reduce_func):
    predicate = in_reduce([], reduce_func)
    assert predicate.get_fields() == set()
    assert predicate.evaluate({}, 3).tolist() == [bool(predicate.do_include({}))] * 3


def test_in_reduce_refuses_what_is_not_a_predicate():
    with pytest.raises(ValueError, match='PredicateBase'):
        in_reduce([in_set({1}, 'id'), 'id == 1'], all)


def test_in_reduce_in_both_readers(tagged_url):
    both = in_reduce([in_set({0, 3, 4, 5}, 'id'), in_negate(in_set({4}, 'id'))], all)
    assert _ids(tagged_url, both) == [0, 3, 5]
    assert _batch_ids(tagged_url, both) == [0, 3, 5]
    either = in_reduce([in_set({1}, 'id'), in_intersection([3], 'tags')], any)
    assert _ids(tagged_url, either) == [1, 2, 3]
