/*
 * petastorm.shuffle._kernel: the inner loops of the shuffling buffer, and of shuffled ragged rows, compiled.
 *
 * The buffer keeps rows as fixed-width records (PackedColumns in petastorm/shuffle/_records.py). Two operations
 * touch every row that passes through it:
 *
 *   pack(store, row_bytes, start, rows, fields)
 *       writes `rows` rows from contiguous input columns into the records [start, start + rows);
 *       fields: a sequence of (column buffer, byte offset in the record, bytes per value).
 *
 *   draw(size, count, key, first, stores)
 *       draws `count` rows, one at a time and without replacement, from the first `size` records of every store,
 *       writing their fields to output columns. Draw t takes the row at position
 *       floor(word(first + t) * (size - t) / 2**64) among the size - t rows still held, and the last held row fills
 *       its place, so the kept rows are the first size - count records afterwards. word(i) is the i-th output of
 *       SplitMix64 started at `key` (a counter hashed: any word is computed on its own), so the words of one
 *       buffer draw can be split into several calls (`first` = the draw's rows already handed out). The same draw
 *       applies to every store (a row can span several stores: its scalars in one, each of its arrays in another).
 *       stores: a sequence of (store buffer, row bytes, fields), fields: (output buffer, offset, bytes).
 *
 * And two outside the buffer, for the reader's shuffled rows and the token loader's positions:
 *
 *   gather(out, values, itemsize, offsets, rows)
 *       the ranges of ragged rows (a list column's values) in the order `rows` names them, one after another into
 *       `out`: row r is values[offsets[r]:offsets[r + 1]] (in items of `itemsize` bytes); offsets and rows are int64.
 *       What shuffling the rows of a row group does to a list column, one memcpy per row (pyarrow's take of a
 *       list array builds an index of every value first). Every range is checked against both buffers.
 *
 *   ramps(out, starts)
 *       counts up from 0 at every start: out[i] = i - starts[j] for starts[j] <= i < starts[j + 1] (the last ramp
 *       runs to the end of `out`); int64, starts ascending from 0. A token row's position_ids, one pass over the
 *       output (numpy needs a fill, a scatter and a running sum).
 *
 * The key comes from the buffer's numpy generator, and petastorm/shuffle/_draw.py replays the same draws with numpy
 * where the kernel is not built or switched off, so both hand out the same rows in the same order. The functions
 * release the GIL while they run. Buffers must be C-contiguous; sizes are checked before any byte moves.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* ---- byte moves ---- */

/* Values of `nbytes` bytes from every `src_stride` bytes of src to every `dst_stride` bytes of dst. The size is
 * tested once per call, so that the loop body is one load and one store for the usual sizes. */
static void copy_strided(char *dst, Py_ssize_t dst_stride, const char *src, Py_ssize_t src_stride, Py_ssize_t n,
                         Py_ssize_t nbytes)
{
#define COPY_LOOP(size) \
    for (Py_ssize_t r = 0; r < n; r++) { \
        memcpy(dst + r * dst_stride, src + r * src_stride, size); \
    } \
    break;
    switch (nbytes) {
    case 1: COPY_LOOP(1)
    case 2: COPY_LOOP(2)
    case 4: COPY_LOOP(4)
    case 8: COPY_LOOP(8)
    case 16: COPY_LOOP(16)
    default: COPY_LOOP((size_t)nbytes)
    }
#undef COPY_LOOP
}

typedef struct {
    char *data;          /* the column: input of pack, output of draw */
    Py_ssize_t offset;   /* in the record */
    Py_ssize_t nbytes;   /* per value */
} field_spec;

typedef struct {
    char *data;
    Py_ssize_t row_bytes;
    Py_ssize_t first_out, num_out;  /* output fields: fields[first_out:first_out + num_out] */
    char *scratch_out;              /* room for DRAW_BLOCK rows, when outputs must be split from whole rows */
} store_spec;

/* Every Py_buffer taken by one call, released together. */
typedef struct {
    Py_buffer *views;
    Py_ssize_t used;
    Py_ssize_t allocated;
} buffer_list;

static int buffers_init(buffer_list *list, Py_ssize_t allocated)
{
    list->used = 0;
    list->allocated = allocated;
    list->views = PyMem_Calloc((size_t)(allocated ? allocated : 1), sizeof(Py_buffer));
    if (list->views == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void buffers_release(buffer_list *list)
{
    for (Py_ssize_t i = 0; i < list->used; i++) {
        PyBuffer_Release(&list->views[i]);
    }
    PyMem_Free(list->views);
    list->views = NULL;
}

/* A C-contiguous buffer of exactly `expected` bytes (at least, when `at_least`), writable when asked. */
static char *take_buffer(buffer_list *list, PyObject *obj, Py_ssize_t expected, int at_least, int writable,
                         const char *what)
{
    Py_buffer *view = &list->views[list->used];
    if (PyObject_GetBuffer(obj, view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    list->used++;
    if (at_least ? view->len < expected : view->len != expected) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, expected %s%zd", what, view->len,
                     at_least ? "at least " : "", expected);
        return NULL;
    }
    return (char *)view->buf;
}

/* Reads (buffer, offset, nbytes) triples; `rows` values per buffer; fields must fit in `row_bytes`. */
static int parse_fields(PyObject *fields, Py_ssize_t rows, Py_ssize_t row_bytes, int writable, buffer_list *list,
                        field_spec *out, const char *what)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fields);
    PyObject **items = PySequence_Fast_ITEMS(fields);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *column;
        Py_ssize_t offset, nbytes;
        if (!PyTuple_Check(items[i])) {
            PyErr_Format(PyExc_TypeError, "%s field %zd must be a tuple (column, offset, nbytes)", what, i);
            return -1;
        }
        if (!PyArg_ParseTuple(items[i], "Onn", &column, &offset, &nbytes)) {
            return -1;
        }
        if (offset < 0 || nbytes <= 0 || offset > row_bytes - nbytes) {
            PyErr_Format(PyExc_ValueError, "%s field %zd: %zd bytes at offset %zd do not fit a %zd-byte row",
                         what, i, nbytes, offset, row_bytes);
            return -1;
        }
        out[i].data = take_buffer(list, column, rows * nbytes, 0, writable, what);
        if (out[i].data == NULL) {
            return -1;
        }
        out[i].offset = offset;
        out[i].nbytes = nbytes;
    }
    return 0;
}

#define PACK_BLOCK 256

static PyObject *shuffle_pack(PyObject *self, PyObject *args)
{
    PyObject *store_obj, *fields_obj;
    Py_ssize_t row_bytes, start, rows;
    if (!PyArg_ParseTuple(args, "OnnnO", &store_obj, &row_bytes, &start, &rows, &fields_obj)) {
        return NULL;
    }
    if (row_bytes <= 0 || start < 0 || rows < 0) {
        PyErr_SetString(PyExc_ValueError, "pack: row_bytes must be positive, start and rows non-negative");
        return NULL;
    }
    PyObject *fields = PySequence_Fast(fields_obj, "pack: fields must be a sequence");
    if (fields == NULL) {
        return NULL;
    }
    Py_ssize_t num_fields = PySequence_Fast_GET_SIZE(fields);
    buffer_list list;
    field_spec *specs = PyMem_Calloc((size_t)(num_fields ? num_fields : 1), sizeof(field_spec));
    if (specs == NULL || buffers_init(&list, num_fields + 1) < 0) {
        PyMem_Free(specs);
        Py_DECREF(fields);
        return specs == NULL ? PyErr_NoMemory() : NULL;
    }
    PyObject *result = NULL;
    char *store = take_buffer(&list, store_obj, (start + rows) * row_bytes, 1, 1, "pack: the store");
    if (store != NULL && parse_fields(fields, rows, row_bytes, 0, &list, specs, "pack: input") == 0) {
        Py_BEGIN_ALLOW_THREADS
        /* A block of records at a time, one field after the other: the block stays in the core's cache. */
        for (Py_ssize_t block = 0; block < rows; block += PACK_BLOCK) {
            Py_ssize_t n = rows - block < PACK_BLOCK ? rows - block : PACK_BLOCK;
            char *records = store + (start + block) * row_bytes;
            for (Py_ssize_t f = 0; f < num_fields; f++) {
                copy_strided(records + specs[f].offset, row_bytes, specs[f].data + block * specs[f].nbytes,
                             specs[f].nbytes, n, specs[f].nbytes);
            }
        }
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    buffers_release(&list);
    PyMem_Free(specs);
    Py_DECREF(fields);
    return result;
}

/* Draws ahead of the one being copied: their rows are asked from memory early (independent random reads). */
#define DRAW_BLOCK 256
#define PREFETCH_AHEAD 16
#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH(address) __builtin_prefetch(address)
#else
#define PREFETCH(address) ((void)0)
#endif

/* Fields [first, first + num) that are one field covering the whole row: rows move without packing or split. */
static int is_whole_row(const field_spec *fields, Py_ssize_t first, Py_ssize_t num, Py_ssize_t row_bytes)
{
    return num == 1 && fields[first].offset == 0 && fields[first].nbytes == row_bytes;
}

/* The parsed `stores` argument of draw, with every buffer and allocation it holds. */
typedef struct {
    Py_ssize_t num_stores;
    store_spec *stores;
    field_spec *fields;
    PyObject **field_lists;  /* the fast sequence of fields of each store */
    buffer_list buffers;
} store_set;

static void stores_release(store_set *set)
{
    if (set->buffers.views != NULL) {
        buffers_release(&set->buffers);
    }
    for (Py_ssize_t s = 0; s < set->num_stores; s++) {
        if (set->stores != NULL) {
            PyMem_Free(set->stores[s].scratch_out);
        }
        if (set->field_lists != NULL) {
            Py_XDECREF(set->field_lists[s]);
        }
    }
    PyMem_Free(set->field_lists);
    PyMem_Free(set->stores);
    PyMem_Free(set->fields);
}

/* Parses (buffer, row_bytes, output fields) per store: every store holds `held` rows at least, every output
 * column has room for exactly `rows` values. */
static int stores_parse(PyObject *stores_seq, Py_ssize_t held, Py_ssize_t rows, store_set *set)
{
    Py_ssize_t n = PySequence_Fast_GET_SIZE(stores_seq);
    PyObject **items = PySequence_Fast_ITEMS(stores_seq);
    Py_ssize_t total_fields = 0;
    memset(set, 0, sizeof(*set));
    set->num_stores = n;
    set->stores = PyMem_Calloc((size_t)(n ? n : 1), sizeof(store_spec));
    set->field_lists = PyMem_Calloc((size_t)(n ? n : 1), sizeof(PyObject *));
    if (set->stores == NULL || set->field_lists == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t s = 0; s < n; s++) {
        store_spec *store = &set->stores[s];
        PyObject *buffer, *outputs;
        if (!PyTuple_Check(items[s])) {
            PyErr_Format(PyExc_TypeError, "draw: store %zd must be a tuple (buffer, row_bytes, outputs)", s);
            return -1;
        }
        if (!PyArg_ParseTuple(items[s], "OnO", &buffer, &store->row_bytes, &outputs)) {
            return -1;
        }
        if (store->row_bytes <= 0) {
            PyErr_Format(PyExc_ValueError, "draw: store %zd has rows of %zd bytes", s, store->row_bytes);
            return -1;
        }
        set->field_lists[s] = PySequence_Fast(outputs, "draw: a store's output fields must be a sequence");
        if (set->field_lists[s] == NULL) {
            return -1;
        }
        store->first_out = total_fields;
        store->num_out = PySequence_Fast_GET_SIZE(set->field_lists[s]);
        total_fields += store->num_out;
    }
    set->fields = PyMem_Calloc((size_t)(total_fields ? total_fields : 1), sizeof(field_spec));
    if (set->fields == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    if (buffers_init(&set->buffers, n + total_fields) < 0) {
        return -1;
    }
    for (Py_ssize_t s = 0; s < n; s++) {
        store_spec *store = &set->stores[s];
        store->data = take_buffer(&set->buffers, PyTuple_GET_ITEM(items[s], 0), held * store->row_bytes, 1, 1,
                                  "draw: a store");
        if (store->data == NULL || parse_fields(set->field_lists[s], rows, store->row_bytes, 1, &set->buffers,
                                                set->fields + store->first_out, "draw: output") < 0) {
            return -1;
        }
        if (!is_whole_row(set->fields, store->first_out, store->num_out, store->row_bytes)) {
            store->scratch_out = PyMem_Malloc((size_t)(DRAW_BLOCK * store->row_bytes));
            if (store->scratch_out == NULL) {
                PyErr_NoMemory();
                return -1;
            }
        }
    }
    return 0;
}

static inline void prefetch_row(const store_spec *store, uint32_t row)
{
    const char *address = store->data + (Py_ssize_t)row * store->row_bytes;
    PREFETCH(address);  /* both ends: a row may straddle two cache lines */
    PREFETCH(address + store->row_bytes - 1);
}

/* Where a block's drawn rows go: the output column itself for whole rows, else the scratch block to split. */
static char *drawn_rows(const store_spec *store, const field_spec *fields, Py_ssize_t block)
{
    return store->scratch_out != NULL ? store->scratch_out : fields[store->first_out].data + block * store->row_bytes;
}

/* The scratch block's rows, still in the cache, split into the output columns at rows [block, block + n). */
static void split_block(const store_spec *store, const field_spec *fields, Py_ssize_t block, Py_ssize_t n)
{
    if (store->scratch_out == NULL) {
        return;
    }
    for (Py_ssize_t f = store->first_out; f < store->first_out + store->num_out; f++) {
        copy_strided(fields[f].data + block * fields[f].nbytes, fields[f].nbytes, store->scratch_out + fields[f].offset,
                     store->row_bytes, n, fields[f].nbytes);
    }
}

/* The i-th word (i >= 1) of SplitMix64 started at `key`: the state key + i * gamma, through its output mix. The
 * same arithmetic as the numpy replay (SplitMix64: Steele, Lea and Flood, 2014; public constants). */
static inline uint64_t draw_word(uint64_t key, uint64_t i)
{
    uint64_t z = key + i * UINT64_C(0x9E3779B97F4A7C15);
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* floor(word * range / 2**64) for range < 2**32, in 64-bit steps: the same arithmetic as the numpy replay. */
static inline uint32_t scale_word(uint64_t word, uint64_t range)
{
    uint64_t low = ((word & UINT64_C(0xFFFFFFFF)) * range) >> 32;
    return (uint32_t)(((word >> 32) * range + low) >> 32);
}

/* Swap-remove: draw t takes one of the size - t rows still held; the last held row fills its place. */
static void draw_rows(const store_set *set, Py_ssize_t size, Py_ssize_t count, uint64_t key, uint64_t first)
{
    uint32_t picks[DRAW_BLOCK];
    for (Py_ssize_t block = 0; block < count; block += DRAW_BLOCK) {
        Py_ssize_t n = count - block < DRAW_BLOCK ? count - block : DRAW_BLOCK;
        for (Py_ssize_t k = 0; k < n; k++) {  /* positions depend on the draw's number only, never on the data */
            uint64_t word = draw_word(key, first + (uint64_t)(block + k) + 1);
            picks[k] = scale_word(word, (uint64_t)(size - block - k));
        }
        for (Py_ssize_t s = 0; s < set->num_stores; s++) {
            const store_spec *store = &set->stores[s];
            const Py_ssize_t row_bytes = store->row_bytes;
            char *drawn = drawn_rows(store, set->fields, block);
            for (Py_ssize_t k = 0; k < n; k++) {  /* in order: a later draw may pick a place an earlier one refilled */
                if (k + PREFETCH_AHEAD < n) {
                    prefetch_row(store, picks[k + PREFETCH_AHEAD]);
                }
                Py_ssize_t last = size - 1 - (block + k);
                char *row = store->data + (Py_ssize_t)picks[k] * row_bytes;
                memcpy(drawn + k * row_bytes, row, (size_t)row_bytes);
                if (picks[k] != last) {
                    memcpy(row, store->data + last * row_bytes, (size_t)row_bytes);
                }
            }
            split_block(store, set->fields, block, n);
        }
    }
}

static PyObject *shuffle_draw(PyObject *self, PyObject *args)
{
    PyObject *stores_obj;
    Py_ssize_t size, count;
    unsigned long long key, first;
    if (!PyArg_ParseTuple(args, "nnKKO", &size, &count, &key, &first, &stores_obj)) {
        return NULL;
    }
    if (size < 0 || count < 0 || count > size || size > (Py_ssize_t)UINT32_MAX) {
        PyErr_Format(PyExc_ValueError, "draw: need 0 <= count <= size < 2**32, got count=%zd size=%zd", count, size);
        return NULL;
    }
    PyObject *stores = PySequence_Fast(stores_obj, "draw: stores must be a sequence");
    if (stores == NULL) {
        return NULL;
    }
    store_set set;
    PyObject *result = NULL;
    if (stores_parse(stores, size, count, &set) == 0) {
        Py_BEGIN_ALLOW_THREADS
        draw_rows(&set, size, count, (uint64_t)key, (uint64_t)first);
        Py_END_ALLOW_THREADS
        result = Py_NewRef(Py_None);
    }
    stores_release(&set);
    Py_DECREF(stores);
    return result;
}

/* The ranges of `rows` copied one after another; -1 (nothing written past a bound) when a row or range is out of
 * bounds, with the failing row's position in *bad. */
static int gather_ranges(char *out, Py_ssize_t out_items, const char *values, Py_ssize_t value_items,
                         Py_ssize_t itemsize, const int64_t *offsets, Py_ssize_t num_offsets, const int64_t *rows,
                         Py_ssize_t num_rows, Py_ssize_t *bad)
{
    Py_ssize_t written = 0;
    for (Py_ssize_t j = 0; j < num_rows; j++) {
        int64_t r = rows[j];
        if (r < 0 || r >= num_offsets - 1) {
            *bad = j;
            return -1;
        }
        int64_t start = offsets[r], stop = offsets[r + 1];
        if (start < 0 || stop < start || stop > value_items || written + (stop - start) > out_items) {
            *bad = j;
            return -1;
        }
        memcpy(out + written * itemsize, values + start * itemsize, (size_t)((stop - start) * itemsize));
        written += stop - start;
    }
    return 0;
}

static PyObject *shuffle_gather(PyObject *self, PyObject *args)
{
    PyObject *out_obj, *values_obj, *offsets_obj, *rows_obj;
    Py_ssize_t itemsize;
    if (!PyArg_ParseTuple(args, "OOnOO", &out_obj, &values_obj, &itemsize, &offsets_obj, &rows_obj)) {
        return NULL;
    }
    if (itemsize <= 0) {
        PyErr_Format(PyExc_ValueError, "gather: itemsize must be positive, got %zd", itemsize);
        return NULL;
    }
    buffer_list list;
    if (buffers_init(&list, 4) < 0) {
        return NULL;
    }
    PyObject *result = NULL;
    Py_buffer *views = list.views;
    char *out = take_buffer(&list, out_obj, 0, 1, 1, "gather: out");
    const char *values = out ? take_buffer(&list, values_obj, 0, 1, 0, "gather: values") : NULL;
    const char *offsets = values ? take_buffer(&list, offsets_obj, 0, 1, 0, "gather: offsets") : NULL;
    const char *rows = offsets ? take_buffer(&list, rows_obj, 0, 1, 0, "gather: rows") : NULL;
    if (rows != NULL) {
        Py_ssize_t bad = -1;
        int failed;
        Py_BEGIN_ALLOW_THREADS
        failed = gather_ranges(out, views[0].len / itemsize, values, views[1].len / itemsize, itemsize,
                               (const int64_t *)offsets, views[2].len / 8, (const int64_t *)rows, views[3].len / 8,
                               &bad);
        Py_END_ALLOW_THREADS
        if (failed) {
            PyErr_Format(PyExc_ValueError, "gather: row %zd of rows names a range outside the values or the output",
                         bad);
        } else {
            result = Py_NewRef(Py_None);
        }
    }
    buffers_release(&list);
    return result;
}

static PyObject *shuffle_ramps(PyObject *self, PyObject *args)
{
    PyObject *out_obj, *starts_obj;
    if (!PyArg_ParseTuple(args, "OO", &out_obj, &starts_obj)) {
        return NULL;
    }
    buffer_list list;
    if (buffers_init(&list, 2) < 0) {
        return NULL;
    }
    PyObject *result = NULL;
    char *out = take_buffer(&list, out_obj, 0, 1, 1, "ramps: out");
    const char *starts_buf = out ? take_buffer(&list, starts_obj, 0, 1, 0, "ramps: starts") : NULL;
    if (starts_buf != NULL) {
        int64_t *values = (int64_t *)out;
        const int64_t *starts = (const int64_t *)starts_buf;
        Py_ssize_t n = list.views[0].len / 8, count = list.views[1].len / 8;
        Py_ssize_t bad = -1;
        for (Py_ssize_t j = 0; j < count && bad < 0; j++) {
            if (starts[j] < (j ? starts[j - 1] : 0) || starts[j] > n || (j == 0 && starts[0] != 0)) {
                bad = j;
            }
        }
        if (bad >= 0) {
            PyErr_Format(PyExc_ValueError, "ramps: starts must ascend from 0 within the %zd values of out, and "
                         "start %zd does not", n, bad);
        } else {
            Py_BEGIN_ALLOW_THREADS
            for (Py_ssize_t j = 0; j < count; j++) {
                int64_t stop = j + 1 < count ? starts[j + 1] : (int64_t)n;
                for (int64_t i = starts[j], k = 0; i < stop; i++, k++) {
                    values[i] = k;
                }
            }
            Py_END_ALLOW_THREADS
            result = Py_NewRef(Py_None);
        }
    }
    buffers_release(&list);
    return result;
}

static PyMethodDef kernel_methods[] = {
    {"pack", shuffle_pack, METH_VARARGS,
     "pack(store, row_bytes, start, rows, fields): write rows of contiguous columns into fixed-width records."},
    {"draw", shuffle_draw, METH_VARARGS,
     "draw(size, count, key, first, stores): draw rows uniformly at random without replacement into output columns."},
    {"gather", shuffle_gather, METH_VARARGS,
     "gather(out, values, itemsize, offsets, rows): the value ranges of ragged rows, in the order rows names them."},
    {"ramps", shuffle_ramps, METH_VARARGS,
     "ramps(out, starts): out[i] = i - the last start at or before i (int64; starts ascending from 0)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef kernel_module = {
    PyModuleDef_HEAD_INIT, "_kernel", "Compiled inner loops of the shuffling buffer.", -1, kernel_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__kernel(void)
{
    return PyModule_Create(&kernel_module);
}
