"""Keys of the key-value metadata in ``_common_metadata``.

Ours hold versioned JSON. Petastorm's keys are read (and the row-group count map is also written, so that
Petastorm itself finds the row groups of datasets we write).
"""

__all__ = [
    'INDEXES_JSON_KEY', 'ROWGROUPS_INDEX_KEY', 'ROW_GROUPS_FORMAT_VERSION', 'ROW_GROUPS_JSON_KEY',
    'ROW_GROUPS_PER_FILE_KEY', 'SCHEMA_JSON_KEY', 'UNISCHEMA_KEY',
]

#: Our schema: JSON from :mod:`petastorm.metadata.schema_json`.
SCHEMA_JSON_KEY = b'petastorm.unischema.json'
#: Our row-group map: ``{"format_version": 1, "files": {relative path: [rows of each row group]}}``.
ROW_GROUPS_JSON_KEY = b'petastorm.row_groups.json'
ROW_GROUPS_FORMAT_VERSION = 1

#: Our row-group indexes: ``{"format_version": 1, "indexes": {name: indexer}}`` (see
#: :mod:`petastorm.metadata.row_group_indexes`).
INDEXES_JSON_KEY = b'petastorm.rowgroup_indexes.json'

#: Petastorm's pickled Unischema (read through the guarded unpickler only).
UNISCHEMA_KEY = b'dataset-toolkit.unischema.v1'
#: Petastorm's JSON ``{relative path: number of row groups}``.
ROW_GROUPS_PER_FILE_KEY = b'dataset-toolkit.num_row_groups_per_file.v1'
#: Petastorm's pickled row-group indexes (read through the guarded unpickler only).
ROWGROUPS_INDEX_KEY = b'dataset-toolkit.rowgroups_index.v1'
