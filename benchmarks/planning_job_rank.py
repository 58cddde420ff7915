"""One rank of a job reading a store for ``remote_planning_bench.py --ranks N`` (torchrun's environment).

Arguments: the dataset URL and the S3 endpoint. With ``WORLD_SIZE`` above 1 it joins a gloo group and reads its
shard (``cur_shard='auto'``, ``shard_mode='rows'``); alone it reads the whole store. Prints one JSON line: the
seconds from the start of the reader to its first batch, to its last, and the rows it read.
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
        shard = {'cur_shard': 'auto', 'shard_count': 'auto', 'shard_mode': 'rows'}
    from petastorm import make_batch_reader

    options = {'key': 'bench', 'secret': 'bench', 'endpoint_url': endpoint}
    started = time.perf_counter()
    first = None
    rows = 0
    with make_batch_reader(url, reader_pool_type='thread', workers_count=4, storage_options=options, seed=1,
                           **shard) as reader:
        for batch in reader:
            first = first if first is not None else time.perf_counter() - started
            rows += len(batch.id)
    print(json.dumps({'first_batch': first, 'epoch': time.perf_counter() - started, 'rows': rows}), flush=True)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == '__main__':
    main()
