"""Distributed reading: the names of :mod:`petastorm.plan` that distributed training code uses, in one place.

* :func:`detect_rank_and_world_size` reads the rank and world size from ``torch.distributed`` (when it is
  initialized) or from the environment variables of the usual launchers (:data:`RANK_ENVIRONMENT`).
* :func:`encode_rows` / :func:`runs_of_rows` number the rows a loader holds, so that its saved position names
  them.

Everything is defined in :mod:`petastorm.plan`; this module only re-exports.
"""

from petastorm.plan import (
    AUTO,
    RANK_ENVIRONMENT,
    SHARD_MODES,
    STATE_VERSION,
    ShardLayout,
    ShardSpec,
    Stage,
    check_state,
    detect_rank_and_world_size,
    encode_rows,
    resolve_shard,
    restored_stage,
    runs_of_rows,
)

__all__ = ['AUTO', 'RANK_ENVIRONMENT', 'SHARD_MODES', 'STATE_VERSION', 'ShardLayout', 'ShardSpec', 'Stage',
           'check_state', 'detect_rank_and_world_size', 'encode_rows', 'resolve_shard', 'restored_stage',
           'runs_of_rows']
