"""Several processes of one node reading through one cache directory at the same moment, as the ranks of a job do."""

import multiprocessing as mp


def run_ranks_together(target, url, cache_dir, counter_path, seeds=(1, 2), timeout=120):
    """Start ``target(url, cache_dir, counter_path, seed, go)`` in a spawned process per seed, release them at once.

    Returns:
        The exit codes of the processes, in seed order.
    """
    context = mp.get_context('spawn')
    go = context.Event()
    processes = [context.Process(target=target, args=(url, str(cache_dir), str(counter_path), seed, go))
                 for seed in seeds]
    for process in processes:
        process.start()
    go.set()
    for process in processes:
        process.join(timeout)
    return [process.exitcode for process in processes]
