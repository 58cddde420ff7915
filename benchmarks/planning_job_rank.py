"""One rank of a job reading a store for ``remote_planning_bench.py --ranks N`` (torchrun's environment).

Arguments: the dataset URL and the S3 endpoint. With ``WORLD_SIZE`` above 1 it joins a gloo group and reads its
shard (``cur_shard='auto'``, ``shard_mode='rows'``, ``shard_remainder='spread'``: when the rows do not divide by
the ranks, as 100,000 by 64, the first ranks read one more, so that every row is read once rather than the last
share padded with the first rows); alone it reads the whole store. Prints one JSON line: the seconds from the
start of the reader to its first batch, to its last, the rows it read and their ``id`` values.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    url, endpoint = sys.argv[1], sys.argv[2]
    world = int(os.environ.get('WORLD_SIZE', '1'))
    shard: dict = {}
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group('gloo')
        shard = {'cur_shard': 'auto', 'shard_count': 'auto', 'shard_mode': 'rows', 'shard_remainder': 'spread'}
    from petastorm import make_batch_reader

    options = {'key': 'bench', 'secret': 'bench', 'endpoint_url': endpoint}
    started = time.perf_counter()
    first = None
    ids = []
    with make_batch_reader(url, reader_pool_type='thread', workers_count=4, storage_options=options, seed=1,
                           **shard) as reader:
        for batch in reader:
            first = first if first is not None else time.perf_counter() - started
            ids.extend(batch.id.tolist())
    print(json.dumps({'first_batch': first, 'epoch': time.perf_counter() - started, 'rows': len(ids), 'ids': ids}),
          flush=True)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == '__main__':
    main()
