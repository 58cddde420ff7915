"""Every consumer of a reader refuses, before reading, what is not one (a URL, a path, a list)."""

import pathlib

import pytest

from petastorm.reading.source import check_reader
from petastorm.tf_utils import make_petastorm_dataset


@pytest.mark.parametrize('url', ['file:///tmp/data', pathlib.Path('/tmp/data'), b'/tmp/data'])
def test_a_url_or_path_is_answered_with_how_to_open_it(url):
    with pytest.raises(TypeError, match=r"make_petastorm_dataset takes a reader, not a dataset URL or path: got .*"
                                        r"make_petastorm_dataset\(make_reader\('.*/tmp/data'\)\)"):
        make_petastorm_dataset(url)


class _ReaderLike:
    """Iterated, stopped and joined: enough to be consumed like a reader."""

    def __iter__(self):
        return iter(())

    def stop(self):
        pass

    def join(self):
        pass


def test_objects_that_behave_like_readers_pass():
    check_reader('consumer', _ReaderLike())


@pytest.mark.parametrize(('value', 'lacking'), [([1, 2], 'stop, join'), ({'id': 1}, 'stop, join'), (3, '__iter__')])
def test_other_objects_are_named_with_what_they_lack(value, lacking):
    with pytest.raises(TypeError, match=rf'consumer takes a reader made by make_reader or make_batch_reader.*got '
                                        rf'{type(value).__name__} \(it has no {lacking}'):
        check_reader('consumer', value)
