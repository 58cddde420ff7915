"""Token loader figures, side by side in one run: packed batches against their limits, first_fit's padding, and
what saving the position every step costs.

1. Pre-tokenized ``list<int32>`` Parquet (log-normal document lengths, median 600 tokens) to packed
   ``seq_len=2048`` batches of 8 rows (``packing='concat'``): tokens/s of ``make_token_loader`` (2 reader threads)
   against the raw limit, pyarrow reading the same column into one numpy array (``pq.read_table``, its own
   threads), and against Hugging Face ``datasets`` streaming the same file with the packing ``.map`` of its
   language-modelling examples (concatenate, cut every 2048 tokens) and batches of 8 rows. Beside the rates per
   second of wall time, the same runs' tokens per second of CPU time (the process's, every thread's): what a run
   costs the machine, which other work on it does not change the way it changes the wall time. For context, a
   plain numpy build of what the batches hold (three int64 arrays from the same column, :func:`packed_limit`).
2. Text tokenized on the fly: a ``tokenizers`` BPE trained here, ``make_token_loader(text_field=...)`` (the
   tokenizer runs in 2 reader threads) against the tokenizer's own ``encode_batch_fast`` on the same texts, a row
   group of texts per call, on the same 2 threads (its Rayon pool).
3. ``packing='first_fit'`` padding on the log-normal corpus of (1): padding tokens / all tokens of the batches.
4. ``state_dict()`` after every step: the main thread's CPU time spent in it as a share of the wall time of the
   rest of the step (its clock time is shown too: it also waits for the GIL while the reader threads hold it). A
   position's lists are made when it is first read (``docs/tokens.md``): the time ``json.dumps`` takes on it, what
   a checkpoint pays, is shown beside it and left out of the step. Reading the thread's CPU clock is a system call
   that costs as much as the call measured: an empty interval timed beside each call says how much, taken off.

The limits run interleaved with ours, ``--repeats`` times each, on the same file, warmed up first (figure 1's
limit runs twice untimed: its first runs map fresh memory and take twice as long as later ones); the table gives
medians of the same-run ratios (rates on a machine shared with other work are noisy). Goals: (1) >= 0.8x the raw
limit, >= 5x ``datasets``; (2) >= 0.9x ``encode_batch``; (3) <= 1% padding; (4) < 2% of a step.

Usage: python benchmarks/tokens_bench.py [--quick] [--repeats N] [--data-root DIR] [--figures 1,2,3,4]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SEQ_LEN = 2048
ROWS = 8
VOCAB = 50_000


def _lognormal_lengths(count: int, rng: np.random.Generator) -> np.ndarray:
    return np.clip(rng.lognormal(np.log(600), 1.0, count).astype(np.int64), 1, 32_768)


def write_token_corpus(path: str, tokens: int, seed: int = 0) -> int:
    """A Parquet file of about ``tokens`` token ids in ``list<int32>`` rows (Zipf-like ids); its document count."""
    rng = np.random.default_rng(seed)
    lengths = _lognormal_lengths(max(1, tokens // 1000), rng)
    lengths = lengths[:max(1, int(np.searchsorted(np.cumsum(lengths), tokens)))]
    weights = 1.0 / np.arange(1, VOCAB + 1) ** 1.1
    values = rng.choice(VOCAB, size=int(lengths.sum()), p=weights / weights.sum()).astype(np.int32)
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int32)
    column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    pq.write_table(pa.table({'input_ids': column}), path, row_group_size=1000)
    return len(lengths)


def _words(rng: np.random.Generator, count: int) -> np.ndarray:
    letters = np.array(list('abcdefghijklmnopqrstuvwxyz'))
    return np.array([''.join(rng.choice(letters, int(n))) for n in rng.integers(2, 10, count)])


def write_text_corpus(path: str, documents: int, seed: int = 1) -> list[str]:
    """A Parquet file of ``documents`` texts (Zipf-distributed synthetic words, log-normal lengths); the texts."""
    rng = np.random.default_rng(seed)
    vocabulary = _words(rng, 20_000)
    weights = 1.0 / np.arange(1, len(vocabulary) + 1) ** 1.05
    words = _lognormal_lengths(documents, rng) * 3 // 4  # about 4 tokens for 3 words
    picks = rng.choice(len(vocabulary), size=int(words.sum()), p=weights / weights.sum())
    bounds = np.concatenate(([0], np.cumsum(words)))
    texts = [' '.join(vocabulary[picks[a:b]]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    pq.write_table(pa.table({'text': texts}), path, row_group_size=500)
    return texts


def train_bpe(texts: list[str]):
    """A BPE of 8192 tokens trained on the first 2000 texts."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token='[UNK]'))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(texts[:2000], trainers.BpeTrainer(vocab_size=8192, special_tokens=['[UNK]'],
                                                                    show_progress=False))
    return tokenizer


# -- (1) packed batches of pre-tokenized documents -------------------------------------------------------------------

def _cpu_seconds() -> float:
    """CPU time of this process so far (every thread's, user and system)."""
    return time.process_time()


def raw_limit(path: str) -> tuple[float, float]:
    """Tokens per second of wall time and of CPU time of pyarrow reading the token column into one numpy array."""
    start, cpu = time.perf_counter(), _cpu_seconds()
    table = pq.read_table(path, columns=['input_ids'])
    values = table.column('input_ids').combine_chunks().flatten().to_numpy()
    return len(values) / (time.perf_counter() - start), len(values) / max(_cpu_seconds() - cpu, 1e-6)


def packed_limit(path: str) -> tuple[float, float]:
    """Tokens per second (wall, CPU) of pyarrow and numpy making what a concat batch holds, for the whole file at once.

    The column read into one numpy array (:func:`raw_limit`), then cut into rows of ``SEQ_LEN`` as three int64
    arrays: the ids, the positions (counted from each document's start and each row's) and the labels (the ids,
    each segment's first one ignored), every step one vectorised numpy call over the whole file. Not a limit (the
    loader makes its rows in blocks, which stay in the CPU's caches): a plain build of the same arrays, to show what
    making them costs beside reading the column.
    """
    start, cpu = time.perf_counter(), _cpu_seconds()
    column = pq.read_table(path, columns=['input_ids']).column('input_ids').combine_chunks()
    values = column.flatten().to_numpy()
    tokens = len(values) // SEQ_LEN * SEQ_LEN
    offsets = np.asarray(column.offsets, dtype=np.int64)
    lengths = np.diff(offsets)
    ids = values[:tokens].astype(np.int64).reshape(-1, SEQ_LEN)
    segment_start = np.repeat(offsets[:-1], lengths)[:tokens]
    row_start = np.arange(tokens, dtype=np.int64) // SEQ_LEN * SEQ_LEN
    positions = np.arange(tokens, dtype=np.int64) - np.maximum(segment_start, row_start)
    labels = ids.copy()
    labels.reshape(-1)[positions == 0] = -100
    positions = positions.reshape(-1, SEQ_LEN)
    return tokens / (time.perf_counter() - start), tokens / max(_cpu_seconds() - cpu, 1e-6)


def ours(url: str, **kwargs) -> tuple[float, dict]:
    """Tokens/s of a pass of ``make_token_loader`` (every batch's tensors made), and its stats (with
    ``'cpu_seconds'``: the process's CPU time of the pass, its readers' threads included)."""
    from petastorm.tokens import make_token_loader

    kwargs.setdefault('workers_count', 2)
    start, cpu = time.perf_counter(), _cpu_seconds()
    with make_token_loader(url, seq_len=SEQ_LEN, batch_size=ROWS, **kwargs) as loader:
        for _batch in loader:
            pass
        stats = loader.stats()
    return sum(stats['tokens']) / (time.perf_counter() - start), dict(stats, cpu_seconds=_cpu_seconds() - cpu)


def hf_streaming(path: str, limit_seconds: float) -> float:
    """Tokens/s of ``datasets`` streaming the file with the concatenate-and-cut ``.map``, batches of 8 rows."""
    import datasets

    def group_texts(examples: dict) -> dict:
        joined = list(itertools.chain.from_iterable(examples['input_ids']))
        usable = len(joined) // SEQ_LEN * SEQ_LEN
        return {'input_ids': [joined[i:i + SEQ_LEN] for i in range(0, usable, SEQ_LEN)]}

    start = time.perf_counter()
    stream = datasets.load_dataset('parquet', data_files=path, split='train', streaming=True)
    packed = stream.map(group_texts, batched=True, batch_size=1000, remove_columns=['input_ids'])
    tokens, rows = 0, []
    for example in packed:
        rows.append(example['input_ids'])
        if len(rows) == ROWS:
            tokens += np.asarray(rows, dtype=np.int64).size
            rows = []
            if time.perf_counter() - start > limit_seconds:
                break
    return tokens / (time.perf_counter() - start)


# -- (2) text tokenized on the fly -------------------------------------------------------------------------------------

def encode_limit(tokenizer, texts: list[str]) -> float:
    """Tokens/s of the tokenizer's own ``encode_batch_fast``, 500 texts (a row group) per call."""
    start = time.perf_counter()
    tokens = 0
    for first in range(0, len(texts), 500):
        encodings = tokenizer.encode_batch_fast(texts[first:first + 500], add_special_tokens=False)
        tokens += sum(len(encoding.ids) for encoding in encodings)
    return tokens / (time.perf_counter() - start)


# -- (4) state_dict() every step ---------------------------------------------------------------------------------------

def state_cost(url: str, steps: int, **kwargs) -> tuple[float, float, float, float, int, float, float]:
    """``state_dict()`` after every step: (its CPU time, its clock time, as shares of the wall time of the rest of
    the step, what the batch takes for it included; its CPU microseconds per call; the microseconds the batch takes
    for it per step; the largest state as JSON bytes; the CPU microseconds of ``json.dumps``
    of it, which makes its lists, as a checkpoint does, left out of the step's time; the CPU microseconds of reading
    the clocks, measured on an empty interval beside each call and taken off its time)."""
    from petastorm.tokens import make_token_loader

    in_state = cpu_in_state = in_json = cpu_in_json = empty = cpu_empty = 0.0
    largest = calls = 0
    with make_token_loader(url, seq_len=SEQ_LEN, batch_size=ROWS, workers_count=2, **kwargs) as loader:
        with_batch = _time_taking_with_the_batch(loader)
        batches = iter(loader)
        next(batches)  # the first batch waits for the readers to start
        start = time.perf_counter()
        for _ in range(steps):
            if next(batches, None) is None:
                break
            # An empty interval, then the call: the first pair of readings is what reading the clocks costs (a
            # system call for the thread's CPU time: a few microseconds after a batch, as much as the call).
            cpu_first, first = time.thread_time(), time.perf_counter()
            cpu_before, before = time.thread_time(), time.perf_counter()
            state = loader.state_dict()
            cpu_after, after = time.thread_time(), time.perf_counter()
            cpu_empty += cpu_before - cpu_first
            empty += before - first
            cpu_in_state += cpu_after - cpu_before
            in_state += after - before
            before, cpu_before = time.perf_counter(), time.thread_time()
            largest = max(largest, len(json.dumps(state)))  # what a checkpoint of it costs: its lists made
            del state  # and let go (a checkpoint's cost too, not the next state_dict()'s)
            in_json += time.perf_counter() - before
            cpu_in_json += time.thread_time() - cpu_before
            calls += 1
        rest = time.perf_counter() - start - in_json - in_state - empty - with_batch[0]
    cpu, clock = max(cpu_in_state - cpu_empty, 0.0), max(in_state - empty, 0.0)
    return ((cpu + with_batch[0]) / rest, (clock + with_batch[0]) / rest, cpu / calls * 1e6,
            with_batch[0] / calls * 1e6, largest,
            cpu_in_json / calls * 1e6, cpu_empty / calls * 1e6)


def _time_taking_with_the_batch(loader) -> list[float]:
    """Once ``state_dict()`` was called, the loader takes the next position as it makes the batch: that part of
    its cost, timed (the CPU seconds it took in all, as the list's one item, less what reading the clock costs)."""
    stream = loader._stream
    take = getattr(stream, '_take', None)
    spent = [0.0]
    if take is None:  # a version that takes every position in state_dict()
        return spent

    def timed(between: bool):
        first = time.thread_time()  # CPU time, as the call's: a machine shared with other work preempts the clock's
        before = time.thread_time()
        made = take(between)
        after = time.thread_time()
        spent[0] += max((after - before) - (before - first), 0.0)
        return made

    stream._take = timed
    return spent


def _interleaved(repeats: int, ours_run: Callable[[], float], limit_run: Callable[[], float]) -> tuple:
    """Medians of ``repeats`` interleaved runs: (ours, limit, ours / limit of the same run)."""
    pairs = []
    for _ in range(repeats):
        mine = ours_run()
        limit = limit_run()
        pairs.append((mine, limit, mine / limit))
    return tuple(statistics.median(column) for column in zip(*pairs, strict=True))


def _row(figure: str, case: str, mine: float, reference: str, limit: float, unit: str, ratio: float,
         goal: str) -> str:
    return f'| {figure} | {case} | {mine:,.0f} | {reference} | {limit:,.0f} | {unit} | {ratio:.2f} | {goal} |'


def figure_1(url: str, path: str, repeats: int) -> None:
    """Packed batches of token ids against the raw limit (wall and CPU time) and against ``datasets``.

    Both cases and the limit run in turn in every repeat, on the same file, after the limit ran twice untimed: its
    first runs map fresh memory (page faults) and a run after them reads about twice as fast, which would
    otherwise flatter whichever case was measured against a cold limit.
    """
    raw_limit(path)
    raw_limit(path)
    runs: dict[bool, list[tuple[float, ...]]] = {False: [], True: []}
    for _ in range(repeats):
        mine = {shuffled: ours(url, shuffle_documents=shuffled) for shuffled in (False, True)}
        limit, limit_cpu = raw_limit(path)
        for shuffled, (rate, stats) in mine.items():
            cpu_rate = sum(stats['tokens']) / max(stats['cpu_seconds'], 1e-6)
            runs[shuffled].append((rate, limit, rate / limit, cpu_rate, limit_cpu, cpu_rate / limit_cpu))
    for shuffled in (False, True):
        rate, limit, ratio, rate_cpu, limit_cpu, ratio_cpu = (statistics.median(c)
                                                              for c in zip(*runs[shuffled], strict=True))
        case = 'concat, documents shuffled' if shuffled else 'concat, in file order'
        print(_row('1', case, rate, 'pyarrow column to numpy', limit, 'tokens/s', ratio, '>= 0.8'))
        print(_row('1', f'{case}, CPU time', rate_cpu, 'pyarrow column to numpy', limit_cpu, 'tokens/CPU-s',
                   ratio_cpu, '>= 0.8'))
    packed_limit(path)
    mine, limit, ratio = _interleaved(repeats, lambda: ours(url, shuffle_documents=False)[0],
                                      lambda: packed_limit(path)[0])
    print(_row('1', 'concat, in file order', mine, 'pyarrow + numpy building the same three int64 arrays', limit,
               'tokens/s', ratio, '(context)'))
    mine, limit, ratio = _interleaved(repeats, lambda: ours(url, shuffle_documents=False)[0],
                                      lambda: hf_streaming(path, 300))
    print(_row('1', 'concat, in file order', mine, 'datasets streaming + packing map', limit, 'tokens/s', ratio,
               '>= 5'))


def figure_2(text_url: str, texts: list[str], repeats: int) -> None:
    """Text tokenized in the reader threads against the tokenizer's own rate."""
    tokenizer = train_bpe(texts)
    mine, limit, ratio = _interleaved(repeats, lambda: ours(text_url, tokenizer=tokenizer, shuffle_documents=False)[0],
                                      lambda: encode_limit(tokenizer, texts))
    print(_row('2', 'text + BPE in the reader threads', mine, 'encode_batch_fast, 2 threads', limit, 'tokens/s', ratio,
               '>= 0.9'))


def figure_3(url: str) -> None:
    """first_fit's padding against one document per row."""
    _, stats = ours(url, packing='first_fit')
    padding = stats['padding_tokens'] / (stats['padding_tokens'] + sum(stats['tokens']))
    _, plain = ours(url, packing='none')
    single = plain['padding_tokens'] / (plain['padding_tokens'] + sum(plain['tokens']))
    print(f"| 3 | first_fit (pack_window=64) padding | {padding:.2%} | packing='none' | {single:.2%} | "
          f'share of tokens | {padding / single:.3f} | <= 1% |')


def figure_4(url: str, steps: int, repeats: int) -> None:
    """What ``state_dict()`` after every step costs."""
    for name, kwargs in (('concat', {}), ('first_fit', {'packing': 'first_fit'}),
                         ('concat, shuffle_buffer=64', {'shuffle_buffer': 64})):
        runs = [state_cost(url, steps, **kwargs) for _ in range(repeats)]
        cpu, clock, micros, batch, size, encode, clocks = (statistics.median(column)
                                                           for column in zip(*runs, strict=True))
        print(f'| 4 | state_dict() every step, {name} | {cpu:.2%} (CPU, {micros:.1f} us a call + {batch:.1f} us '
              f'with the batch) | clock | '
              f'{clock:.2%} | share of a loader step | {size:,.0f} bytes of JSON, {encode:.0f} us to encode '
              f'(a checkpoint); reading the clocks {clocks:.1f} us, taken off | < 2% |')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--quick', action='store_true', help='small corpora, 1 repeat (a smoke run)')
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--data-root', default=None)
    parser.add_argument('--figures', default='1,2,3,4', help='the figures to measure, e.g. 1,4 (default: all)')
    args = parser.parse_args()
    figures = set(args.figures.split(','))
    repeats = 1 if args.quick else args.repeats
    root = args.data_root or tempfile.mkdtemp(prefix='tokens_bench_')
    try:
        _run(args, figures, repeats, root)
    finally:
        if args.data_root is None:  # its own scratch corpora (about 70 MB); a --data-root is the caller's
            shutil.rmtree(root, ignore_errors=True)


def _run(args: argparse.Namespace, figures: set[str], repeats: int, root: str) -> None:
    tokens_path = os.path.join(root, 'tokens.parquet')
    text_path = os.path.join(root, 'text.parquet')
    documents = write_token_corpus(tokens_path, 400_000 if args.quick else 30_000_000)
    texts = write_text_corpus(text_path, 300 if args.quick else 6000) if '2' in figures else []
    url, text_url = 'file://' + tokens_path, 'file://' + text_path
    print(f'{documents:,} documents of token ids in {tokens_path}; {len(texts):,} texts in {text_path}; '
          f'seq_len={SEQ_LEN}, {ROWS} rows per batch, 2 reader threads; medians of {repeats} interleaved runs; '
          f'{os.cpu_count()} cores')
    print('| figure | case | ours | reference | reference value | unit | ratio | goal |')
    print('|---|---|---:|---|---:|---|---:|---|')
    ours(url)  # warm-up: page cache, lazy imports
    if '1' in figures:
        figure_1(url, tokens_path, repeats)
    if '2' in figures:
        figure_2(text_url, texts, repeats)
    if '3' in figures:
        figure_3(url)
    if '4' in figures:
        figure_4(url, 50 if args.quick else 400, repeats)


if __name__ == '__main__':
    main()
