"""Pure planning: which rows each worker reads, for which shard, in which order, epoch after epoch.

Everything here is a deterministic function of plain data (the dataset's row groups, the options, the seed, the
epoch, saved positions): no I/O, no threads, no clock. Storage reads footers, statistics and indexes and hands
in what they say; :meth:`ShardSpec.from_env` is the one place that looks at the process (its rank).

* :mod:`~petastorm.plan.items`: work items (row ranges of row groups), sharding by row groups, drop partitions.
* :mod:`~petastorm.plan.order`: the order of an epoch and of the rows inside each item.
* :mod:`~petastorm.plan.runs`: sequences of rows of the global order, equal shares for ``shard_mode='rows'``.
* :mod:`~petastorm.plan.shard`: which shard this reader is.
* :mod:`~petastorm.plan.selection`: which row groups are read, and the layout of one shard's epochs.
* :mod:`~petastorm.plan.layout`: the scheduled items of each epoch of a shard, and the stages of a pass.
* :mod:`~petastorm.plan.resume`: delivered positions as a state, and restoring one (also across world sizes).
* :mod:`~petastorm.plan.state`: the saved state, typed (:class:`ReaderState`), and the states of every rank.
"""

from petastorm.plan.items import ScheduledItem, WorkItem, shard_items, split_drop_partitions, split_head
from petastorm.plan.layout import ShardLayout, Stage, pass_stages
from petastorm.plan.order import (
    RowMatches,
    epoch_order,
    epoch_rng,
    epoch_schedule,
    kept_rows,
    row_permutation,
    unit_rows,
)
from petastorm.plan.resume import (
    Cursor,
    check_state,
    cursor_row_ids,
    cursor_stage,
    position_state,
    restored_stage,
)
from petastorm.plan.runs import (
    REMAINDER_POLICIES,
    Remainder,
    Run,
    encode_rows,
    merge_runs,
    rank_share,
    remainder_rows,
    remaining_runs,
    runs_length,
    runs_of_rows,
    share_size,
    slice_runs,
    units_of_runs,
)
from petastorm.plan.selection import make_layout, select_row_groups
from petastorm.plan.shard import (
    AUTO,
    RANK_ENVIRONMENT,
    SHARD_MODES,
    ShardMode,
    ShardSpec,
    detect_rank_and_world_size,
    resolve_shard,
)
from petastorm.plan.state import STATE_VERSION, ReaderState, every_rank, rank_states
from petastorm.plan.streamed import streamed_first_epoch

__all__ = [
    'AUTO', 'RANK_ENVIRONMENT', 'REMAINDER_POLICIES', 'SHARD_MODES', 'STATE_VERSION', 'Cursor', 'ReaderState',
    'Remainder', 'RowMatches', 'Run', 'ScheduledItem', 'ShardLayout', 'ShardMode', 'ShardSpec', 'Stage', 'WorkItem',
    'check_state', 'cursor_row_ids', 'cursor_stage', 'detect_rank_and_world_size', 'encode_rows', 'epoch_order',
    'epoch_rng', 'epoch_schedule', 'every_rank', 'kept_rows', 'make_layout', 'merge_runs', 'pass_stages',
    'position_state', 'rank_share', 'rank_states',
    'remainder_rows', 'remaining_runs', 'resolve_shard', 'restored_stage', 'row_permutation', 'runs_length',
    'runs_of_rows', 'select_row_groups', 'shard_items', 'share_size', 'slice_runs',
    'split_drop_partitions', 'split_head', 'streamed_first_epoch', 'unit_rows', 'units_of_runs',
]
