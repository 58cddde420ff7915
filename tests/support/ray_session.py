"""Stopping a local Ray instance in tests without racing Ray Data's background threads.

``ray.shutdown()`` while a Ray Data thread still works ends the whole test process. The thread touches the shut-down
core worker, and Ray exits the process with code 1 and no Python traceback. Two kinds of thread do this:
- the block prefetcher, which ``take_batch`` leaves behind (it stops only when its iterator is collected) and which
  may run its last ``ray.wait`` late on a loaded machine;
- the executor's scheduling thread, for which the executor's own shutdown waits only 2 seconds.
"""

import gc
import threading
import time


def start_ray(module_name):
    """A local Ray of 2 CPUs for the tests of ``module_name``, whose functions go to the workers by value (tests are
    not installed), with Ray Data's progress output off."""
    import sys

    import ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[module_name])
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address='127.0.0.1', log_to_driver=False,
             configure_logging=False)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False


def stop_ray(timeout=60.0):
    """Stop Ray Data's prefetchers, wait for them and the executors' threads to end, then shut Ray down."""
    import ray

    gc.collect()  # unfinished dataset iterators shut their executors down when collected
    deadline = time.monotonic() + timeout
    for thread in threading.enumerate():
        if thread.name == 'Prefetcher':
            # The thread's target is its prefetcher's loop; stopping it ends the loop after any pending fetch.
            prefetcher = getattr(getattr(thread, '_target', None), '__self__', None)
            stop = getattr(prefetcher, 'stop', None)
            if stop is not None:
                stop()
        elif type(thread).__name__ != 'StreamingExecutor':
            continue
        thread.join(max(0.0, deadline - time.monotonic()))
    ray.shutdown()
