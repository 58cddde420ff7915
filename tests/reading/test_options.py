"""ReaderOptions is the one list of the readers' arguments: the factories' signatures must agree with it."""

import inspect

import pytest

from petastorm import make_batch_reader, make_reader
from petastorm.reading.options import ReaderOptions, reader_arguments, validate_options


@pytest.mark.parametrize(('factory', 'batched'), [(make_reader, False), (make_batch_reader, True)])
def test_factory_signatures_are_the_options_arguments(factory, batched):
    parameters = list(inspect.signature(factory).parameters.values())
    declared = reader_arguments(batched)
    # The first argument is the dataset URL, named as Petastorm named it; it has no default.
    assert parameters[0].name == ('dataset_url_or_urls' if batched else 'dataset_url')
    assert parameters[0].default is inspect.Parameter.empty
    assert [(p.name, p.default) for p in parameters[1:]] == [(f.name, f.default) for f in declared[1:]]


@pytest.mark.parametrize(('factory', 'batched'), [(make_reader, False), (make_batch_reader, True)])
def test_factories_hand_every_argument_to_the_options_by_name(factory, batched, monkeypatch):
    # Each argument gets its own marker value: the options must receive every one, under its own name.
    handed = {}

    def capture(**arguments):
        handed.update(arguments)
        raise LookupError('captured')

    monkeypatch.setattr('petastorm.reader.validate_options', capture)
    names = [f.name for f in reader_arguments(batched)[1:]]
    markers = {name: object() for name in names}
    with pytest.raises(LookupError, match='captured'):
        factory('file:///x', **markers)
    assert handed.pop('dataset_url_or_urls') == 'file:///x'
    assert handed.pop('batched_output') is batched
    assert handed.keys() == markers.keys()
    assert all(handed[name] is markers[name] for name in names)


def test_make_batch_reader_takes_every_argument_but_pyarrow_serialize():
    rows = {f.name for f in reader_arguments(False)}
    batches = {f.name for f in reader_arguments(True)}
    assert rows - batches == {'pyarrow_serialize'}


def test_options_refuse_an_unknown_argument_by_name():
    with pytest.raises(TypeError, match='shuffle_row_group'):
        validate_options(dataset_url_or_urls='file:///x', batched_output=True, shuffle_row_group=False)


def test_options_are_frozen_and_normalized():
    options = validate_options(dataset_url_or_urls=['file:///a', 'file:///b'], batched_output=False,
                               cur_shard=1, shard_count=3, seed=7)
    assert options.dataset_url_or_urls == ('file:///a', 'file:///b')
    assert (options.shard.shard, options.shard.count, options.shard.mode) == (1, 3, 'row_groups')
    with pytest.raises(AttributeError):
        options.seed = 8  # type: ignore[misc]
    assert isinstance(options, ReaderOptions)
