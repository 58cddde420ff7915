"""One rank of a job reading a store from the loopback S3 server (run by tests/reading/test_job_plan.py).

Arguments: the endpoint, the dataset URL, then flags: ``--late`` (the last rank makes its reader 1.5 s after the
others), ``--plan-file PATH``, ``--catch`` (an error making the reader is printed, not raised), ``--shard-mode``
(``rows`` by default). Prints one JSON line: the rank, the ids it read, a digest of its plan; or with ``--catch``,
the error's type and message.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time

import pyarrow.dataset  # noqa: F401  (as in the test's process: every file read by its listed size, see main)
import torch.distributed as dist

from petastorm import make_batch_reader


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument('endpoint')
    parser.add_argument('url')
    parser.add_argument('--late', action='store_true')
    parser.add_argument('--plan-file', default=None)
    parser.add_argument('--catch', action='store_true')
    parser.add_argument('--shard-mode', default='rows')
    args = parser.parse_args()
    dist.init_process_group('gloo')
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.late and rank == world - 1:
        time.sleep(1.5)
    # pyarrow.dataset is imported above, as the test's own process has it when it counts one reader's requests:
    # rank 0 then reads the footers by their listed sizes as that reader does, where a process without it would
    # open a store this small the plain way (a HEAD per file, petastorm.store.plain_or_sized.plain_opens).
    options = {'key': 'test-key', 'secret': 'test-secret', 'endpoint_url': args.endpoint}
    try:
        with make_batch_reader(args.url, cur_shard='auto', shard_count='auto', shard_mode=args.shard_mode, seed=3,
                               reader_pool_type='thread', workers_count=2, storage_options=options,
                               plan_file=args.plan_file) as reader:
            pieces = [(p.path, p.row_group, p.num_rows) for p in reader.dataset.row_groups()]
            ids = [int(i) for batch in reader for i in batch.id]
    except Exception as err:
        if not args.catch:
            raise
        print('RESULT ' + json.dumps({'rank': rank, 'error': type(err).__name__, 'message': str(err)}), flush=True)
    else:
        digest = hashlib.sha256(json.dumps(pieces).encode()).hexdigest()
        print('RESULT ' + json.dumps({'rank': rank, 'ids': ids, 'plan': digest}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == '__main__':
    main()
