/*
 * petastorm.codecs._png_rows: the parts of PNG decoding around the inflate step, compiled.
 *
 * A PNG file is a signature and a list of chunks (length, type, data, CRC-32 of type and data). The image is the
 * zlib stream made of the data of its IDAT chunks, which follow one another; inflated, it is `height` rows of one
 * filter-type byte followed by `row_bytes` filtered bytes (PNG specification, sections 5 and 9). This module
 * collects the stream and, once the caller has inflated it, turns the rows into pixels:
 *
 *   gather(payload, into) -> int
 *       checks the CRC of the header chunk (IHDR) and of every IDAT chunk, copies the IDAT data one after the
 *       other to the writable buffer `into` (which must hold len(payload) bytes) and returns how many it copied;
 *       ValueError for a chunk that runs past the end, a failed CRC, or no image data.
 *
 *   unfilter(raw, out, height, row_bytes, bpp, sample_bytes, swap_red_blue)
 *       raw: height * (row_bytes + 1) bytes, the inflated image data;
 *       out: a writable C-contiguous buffer of height * row_bytes bytes;
 *       bpp: bytes per complete pixel (1 to 8), the distance the filters look left;
 *       sample_bytes: 1, or 2 for 16-bit samples, which PNG stores big-endian and `out` gets in native order;
 *       swap_red_blue: swap the first and third sample of every 4-sample pixel (RGBA to BGRA, as OpenCV gives);
 *       ValueError for an unknown filter type or sizes that do not match.
 *
 * Filters, per row, reconstruct byte x from a (the byte one pixel to the left), b (the byte above) and c (the
 * byte above and one pixel left), all zero outside the image: 0 none, 1 sub x + a, 2 up x + b, 3 average
 * x + floor((a + b) / 2), 4 Paeth x + the one of a, b, c closest to a + b - c (ties prefer a, then b).
 *
 * The filters read the row above as stored, so the byte order and channel swaps are done one row behind the
 * reconstruction. Both functions release the GIL while they work. On x86-64 the chunk CRCs use carry-less
 * multiplication and the "sub" filter (the one OpenCV writes) byte shuffles, when the processor has them.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_X86_SIMD 1
#endif

/* What the processor can do, found once when the module is made (the code checks before it uses either). */
static int clmul_available = 0;
static int ssse3_available = 0;

#define MAX_BPP 8
#if defined(__GNUC__) || defined(__clang__)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#else
#define ALWAYS_INLINE inline
#endif

/* Each filter is written for a constant bpp (the switch in unfilter_row inlines one copy per value), so that the
 * bytes to the left stay in registers instead of being read back from the row just written.
 *
 * Sub, from byte `start` on (the bytes before it are done; with start 0 the row begins). */
static ALWAYS_INLINE void sub_row(const uint8_t *x, uint8_t *out, Py_ssize_t start, Py_ssize_t n, const int bpp)
{
    uint8_t a[MAX_BPP] = {0};
    if (start >= bpp) {
        memcpy(a, out + start - bpp, (size_t)bpp);
    }
    for (Py_ssize_t i = start; i + bpp <= n; i += bpp) {
        for (int k = 0; k < bpp; k++) {
            a[k] = (uint8_t)(x[i + k] + a[k]);
            out[i + k] = a[k];
        }
    }
}

#ifdef HAVE_X86_SIMD
/* Sub is a running sum per channel. Sixteen bytes at a time: adding the vector to itself shifted by 1, 2, 4...
 * pixels sums each byte with the earlier ones of its channel in the vector, then the last pixel of the previous
 * vector (broadcast by a byte shuffle) carries the sum on. A vector holds `step` bytes of whole pixels; the bytes
 * past them are written too and then written again by the next step, so the loop stops 16 bytes before the end
 * and sub_row does the rest. Returns where it stopped. */
#define SUB_BY_VECTORS(NAME, BPP, STEP, SHIFTS) \
    __attribute__((target("ssse3"))) static Py_ssize_t NAME(const uint8_t *x, uint8_t *out, Py_ssize_t n) \
    { \
        uint8_t pattern[16]; \
        for (int j = 0; j < 16; j++) { \
            pattern[j] = (uint8_t)(j < (STEP) ? (STEP) - (BPP) + j % (BPP) : 0x80); \
        } \
        const __m128i last_pixel = _mm_loadu_si128((const __m128i *)pattern); \
        __m128i carry = _mm_setzero_si128(); \
        Py_ssize_t i = 0; \
        for (; i + 16 <= n; i += (STEP)) { \
            __m128i v = _mm_loadu_si128((const __m128i *)(x + i)); \
            SHIFTS \
            v = _mm_add_epi8(v, carry); \
            _mm_storeu_si128((__m128i *)(out + i), v); \
            carry = _mm_shuffle_epi8(v, last_pixel); \
        } \
        return i; \
    }
#define ADD_SHIFTED(BYTES) v = _mm_add_epi8(v, _mm_slli_si128(v, BYTES));

SUB_BY_VECTORS(sub_vectors_1, 1, 16, ADD_SHIFTED(1) ADD_SHIFTED(2) ADD_SHIFTED(4) ADD_SHIFTED(8))
SUB_BY_VECTORS(sub_vectors_2, 2, 16, ADD_SHIFTED(2) ADD_SHIFTED(4) ADD_SHIFTED(8))
SUB_BY_VECTORS(sub_vectors_3, 3, 12, ADD_SHIFTED(3) ADD_SHIFTED(6))
SUB_BY_VECTORS(sub_vectors_4, 4, 16, ADD_SHIFTED(4) ADD_SHIFTED(8))
SUB_BY_VECTORS(sub_vectors_6, 6, 12, ADD_SHIFTED(6))
SUB_BY_VECTORS(sub_vectors_8, 8, 16, ADD_SHIFTED(8))
#undef ADD_SHIFTED
#undef SUB_BY_VECTORS
#endif

/* How far the vector code took a sub row (0 where it cannot run). */
static Py_ssize_t sub_by_vectors(const uint8_t *x, uint8_t *out, Py_ssize_t n, int bpp)
{
#ifdef HAVE_X86_SIMD
    if (ssse3_available) {
        switch (bpp) {
        case 1: return sub_vectors_1(x, out, n);
        case 2: return sub_vectors_2(x, out, n);
        case 3: return sub_vectors_3(x, out, n);
        case 4: return sub_vectors_4(x, out, n);
        case 6: return sub_vectors_6(x, out, n);
        case 8: return sub_vectors_8(x, out, n);
        default: break;
        }
    }
#endif
    return 0;
}

static ALWAYS_INLINE void average_row(const uint8_t *x, const uint8_t *above, uint8_t *out, Py_ssize_t n,
                                      const int bpp)
{
    uint8_t a[MAX_BPP] = {0};
    for (Py_ssize_t i = 0; i + bpp <= n; i += bpp) {
        for (int k = 0; k < bpp; k++) {
            a[k] = (uint8_t)(x[i + k] + ((a[k] + above[i + k]) >> 1));
            out[i + k] = a[k];
        }
    }
}

static ALWAYS_INLINE uint8_t paeth(int a, int b, int c)
{
    int pa = abs(b - c), pb = abs(a - c), pc = abs(a + b - 2 * c);
    if (pa <= pb && pa <= pc) {
        return (uint8_t)a;
    }
    return (uint8_t)(pb <= pc ? b : c);
}

static ALWAYS_INLINE void paeth_row(const uint8_t *x, const uint8_t *above, uint8_t *out, Py_ssize_t n,
                                    const int bpp)
{
    uint8_t a[MAX_BPP] = {0}, c[MAX_BPP] = {0};
    for (Py_ssize_t i = 0; i + bpp <= n; i += bpp) {
        for (int k = 0; k < bpp; k++) {
            uint8_t b = above[i + k];
            a[k] = (uint8_t)(x[i + k] + paeth(a[k], b, c[k]));
            c[k] = b;
            out[i + k] = a[k];
        }
    }
}

#define FOR_EACH_BPP(CALL) \
    switch (bpp) { \
    case 1: CALL(1); break; \
    case 2: CALL(2); break; \
    case 3: CALL(3); break; \
    case 4: CALL(4); break; \
    case 6: CALL(6); break; \
    case 8: CALL(8); break; \
    default: CALL(bpp); break; \
    }

/* Reconstructs one row into `out`; `above` is the reconstructed row above (zeros for the first). 0 on success. */
static int unfilter_row(int filter, const uint8_t *x, const uint8_t *above, uint8_t *out, Py_ssize_t n, int bpp)
{
    switch (filter) {
    case 0:
        memcpy(out, x, (size_t)n);
        return 0;
    case 1: {
        Py_ssize_t start = sub_by_vectors(x, out, n, bpp);
#define SUB(b) sub_row(x, out, start, n, b)
        FOR_EACH_BPP(SUB)
#undef SUB
        return 0;
    }
    case 2:
        for (Py_ssize_t i = 0; i < n; i++) {
            out[i] = (uint8_t)(x[i] + above[i]);
        }
        return 0;
    case 3:
#define AVERAGE(b) average_row(x, above, out, n, b)
        FOR_EACH_BPP(AVERAGE)
#undef AVERAGE
        return 0;
    case 4:
#define PAETH(b) paeth_row(x, above, out, n, b)
        FOR_EACH_BPP(PAETH)
#undef PAETH
        return 0;
    default:
        return -1;
    }
}

/* The byte order and channel order the caller wants, applied to one reconstructed row in place. */
static void finish_row(uint8_t *row, Py_ssize_t n, int sample_bytes, int swap_red_blue)
{
#if PY_LITTLE_ENDIAN
    if (sample_bytes == 2) {
        for (Py_ssize_t i = 0; i + 1 < n; i += 2) {
            uint8_t high = row[i];
            row[i] = row[i + 1];
            row[i + 1] = high;
        }
    }
#endif
    if (swap_red_blue) {
        Py_ssize_t pixel = 4 * (Py_ssize_t)sample_bytes, blue = 2 * (Py_ssize_t)sample_bytes;
        for (Py_ssize_t i = 0; i + pixel <= n; i += pixel) {
            for (int k = 0; k < sample_bytes; k++) {
                uint8_t red = row[i + k];
                row[i + k] = row[i + blue + k];
                row[i + blue + k] = red;
            }
        }
    }
}

static PyObject *unfilter(PyObject *self, PyObject *args)
{
    Py_buffer raw, out;
    Py_ssize_t height, row_bytes;
    int bpp, sample_bytes, swap_red_blue;
    if (!PyArg_ParseTuple(args, "y*w*nniip:unfilter", &raw, &out, &height, &row_bytes, &bpp, &sample_bytes,
                          &swap_red_blue)) {
        return NULL;
    }
    PyObject *result = NULL;
    uint8_t *zeros = NULL;
    if (!PyBuffer_IsContiguous(&out, 'C')) {
        PyErr_SetString(PyExc_ValueError, "unfilter: out must be C-contiguous");
        goto done;
    }
    if (height < 0 || row_bytes < 0 || bpp < 1 || bpp > MAX_BPP || (sample_bytes != 1 && sample_bytes != 2)
        || (height > 0 && row_bytes > PY_SSIZE_T_MAX / height - 1)) {
        PyErr_SetString(PyExc_ValueError, "unfilter: bad image geometry");
        goto done;
    }
    if (raw.len != height * (row_bytes + 1) || out.len != height * row_bytes) {
        PyErr_Format(PyExc_ValueError, "unfilter: expected %zd bytes of image data and %zd of output, got %zd and %zd",
                     height * (row_bytes + 1), height * row_bytes, raw.len, out.len);
        goto done;
    }
    zeros = calloc((size_t)row_bytes + 1, 1);
    if (zeros == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t bad_row = -1;
    int bad_filter = 0;
    int finishing = sample_bytes == 2 || swap_red_blue;
    Py_BEGIN_ALLOW_THREADS
    const uint8_t *source = raw.buf;
    uint8_t *target = out.buf;
    for (Py_ssize_t r = 0; r < height; r++) {
        const uint8_t *line = source + r * (row_bytes + 1);
        uint8_t *row = target + r * row_bytes;
        const uint8_t *above = r ? row - row_bytes : zeros;
        if (unfilter_row(line[0], line + 1, above, row, row_bytes, bpp) != 0) {
            bad_row = r;
            bad_filter = line[0];
            break;
        }
        if (finishing && r) {
            finish_row(row - row_bytes, row_bytes, sample_bytes, swap_red_blue);
        }
    }
    if (finishing && bad_row < 0 && height) {
        finish_row(target + (height - 1) * row_bytes, row_bytes, sample_bytes, swap_red_blue);
    }
    Py_END_ALLOW_THREADS
    if (bad_row >= 0) {
        PyErr_Format(PyExc_ValueError, "unfilter: row %zd has the unknown filter type %d", bad_row, bad_filter);
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    free(zeros);
    PyBuffer_Release(&raw);
    PyBuffer_Release(&out);
    return result;
}

/* ---- chunks ---- */

static uint32_t read_be32(const uint8_t *p)
{
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

/* CRC-32 of PNG (and zlib, gzip) over n bytes, by zlib. */
static uint32_t crc32_by_zlib(const uint8_t *p, size_t n)
{
    uLong crc = crc32(0L, Z_NULL, 0);
    while (n > 0) {  /* zlib takes uInt lengths */
        uInt step = n > 0x40000000u ? 0x40000000u : (uInt)n;
        crc = crc32(crc, p, step);
        p += step;
        n -= step;
    }
    return (uint32_t)crc;
}

#ifdef HAVE_X86_SIMD

/* The same CRC with carry-less multiplication, several times faster than zlib's tables on image-sized chunks.
 *
 * CRC-32 is the remainder of the message (bits taken low bit first) times x^32, modulo the polynomial P. Any
 * 16-byte block X followed by d more bytes can be replaced by a block congruent to X * x^(8d) modulo P without
 * changing that remainder: with the block's two 8-byte halves (bit-reflected, as they load), that is
 * lo * K(8d + 32) xor hi * K(8d - 32), where K(e) is x^e mod P bit-reflected and shifted left by one (the
 * product of two reflected polynomials comes out one bit short). Four blocks are folded over the next 64 bytes
 * at a time, then into one, then over the last whole blocks; the zlib call finishes on the folded block and the
 * remaining bytes. The usual starting value (all ones) is xored into the first four bytes, so zlib continues from
 * a zero register, which is what passing it all ones gives. The constants are K(544), K(480) for 64 bytes and
 * K(160), K(96) for 16; tests/model/test_png_reader.py compares this function with zlib on every length to 300.
 */
__attribute__((target("pclmul"))) static inline __m128i fold(__m128i block, __m128i k, __m128i next)
{
    return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(block, k, 0x00), _mm_clmulepi64_si128(block, k, 0x11)),
                         next);
}

__attribute__((target("pclmul"))) static uint32_t crc32_by_clmul(const uint8_t *p, size_t n)
{
    const __m128i by_64 = _mm_set_epi64x(0x1c6e41596LL, 0x154442bd4LL);
    const __m128i by_16 = _mm_set_epi64x(0x0ccaa009eLL, 0x1751997d0LL);
    __m128i a = _mm_xor_si128(_mm_loadu_si128((const __m128i *)p), _mm_cvtsi32_si128(-1));
    __m128i b = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(p + 32));
    __m128i d = _mm_loadu_si128((const __m128i *)(p + 48));
    size_t position = 64;
    for (; position + 64 <= n; position += 64) {
        a = fold(a, by_64, _mm_loadu_si128((const __m128i *)(p + position)));
        b = fold(b, by_64, _mm_loadu_si128((const __m128i *)(p + position + 16)));
        c = fold(c, by_64, _mm_loadu_si128((const __m128i *)(p + position + 32)));
        d = fold(d, by_64, _mm_loadu_si128((const __m128i *)(p + position + 48)));
    }
    a = fold(fold(fold(a, by_16, b), by_16, c), by_16, d);
    for (; position + 16 <= n; position += 16) {
        a = fold(a, by_16, _mm_loadu_si128((const __m128i *)(p + position)));
    }
    uint8_t last[32];
    _mm_storeu_si128((__m128i *)last, a);
    memcpy(last + 16, p + position, n - position);
    return (uint32_t)crc32(0xFFFFFFFFUL, last, (uInt)(16 + n - position));
}
#endif

static uint32_t png_crc32(const uint8_t *p, size_t n)
{
#ifdef HAVE_X86_SIMD
    if (clmul_available && n >= 64) {
        return crc32_by_clmul(p, n);
    }
#endif
    return crc32_by_zlib(p, n);
}

/* Whether the chunk at `chunk` (its length field) with `length` data bytes carries a correct CRC. */
static int crc_holds(const uint8_t *chunk, uint32_t length)
{
    return png_crc32(chunk + 4, (size_t)length + 4) == read_be32(chunk + 8 + length);  /* over type and data */
}

#define SIGNATURE_BYTES 8
#define IHDR_DATA_BYTES 13

enum gather_error { GATHER_OK, GATHER_TRUNCATED, GATHER_BAD_CRC, GATHER_NO_DATA };

static enum gather_error gather_idat(const uint8_t *file, Py_ssize_t size, uint8_t *into, Py_ssize_t *copied)
{
    Py_ssize_t position = SIGNATURE_BYTES, total = 0;
    int in_image_data = 0;
    if (size < SIGNATURE_BYTES + 12 + IHDR_DATA_BYTES) {
        return GATHER_TRUNCATED;
    }
    if (!crc_holds(file + position, IHDR_DATA_BYTES)) {
        return GATHER_BAD_CRC;
    }
    position += 12 + IHDR_DATA_BYTES;
    while (position + 8 <= size) {
        uint32_t length = read_be32(file + position);
        const uint8_t *kind = file + position + 4;
        if ((Py_ssize_t)length > size - position - 12) {
            return GATHER_TRUNCATED;
        }
        if (memcmp(kind, "IDAT", 4) == 0) {
            if (!crc_holds(file + position, length)) {
                return GATHER_BAD_CRC;
            }
            memcpy(into + total, file + position + 8, length);
            total += length;
            in_image_data = 1;
        }
        else if (in_image_data) {
            break;  /* the image data ends at the first other chunk */
        }
        position += 12 + (Py_ssize_t)length;
    }
    *copied = total;
    return in_image_data ? GATHER_OK : GATHER_NO_DATA;
}

static PyObject *gather(PyObject *self, PyObject *args)
{
    Py_buffer payload, into;
    if (!PyArg_ParseTuple(args, "y*w*:gather", &payload, &into)) {
        return NULL;
    }
    PyObject *result = NULL;
    if (into.len < payload.len) {
        PyErr_Format(PyExc_ValueError, "gather: the buffer holds %zd bytes, the file has %zd", into.len, payload.len);
        goto done;
    }
    Py_ssize_t copied = 0;
    enum gather_error error;
    Py_BEGIN_ALLOW_THREADS
    error = gather_idat(payload.buf, payload.len, into.buf, &copied);
    Py_END_ALLOW_THREADS
    switch (error) {
    case GATHER_OK:
        result = PyLong_FromSsize_t(copied);
        break;
    case GATHER_TRUNCATED:
        PyErr_SetString(PyExc_ValueError, "PNG reader: a chunk runs past the end of the file");
        break;
    case GATHER_BAD_CRC:
        PyErr_SetString(PyExc_ValueError, "PNG reader: a chunk fails its CRC check");
        break;
    case GATHER_NO_DATA:
        PyErr_SetString(PyExc_ValueError, "PNG reader: no image data");
        break;
    }
done:
    PyBuffer_Release(&payload);
    PyBuffer_Release(&into);
    return result;
}

/* crc32(data) -> int: the CRC the chunks are checked with, for tests. */
static PyObject *crc32_of(PyObject *self, PyObject *args)
{
    Py_buffer data;
    if (!PyArg_ParseTuple(args, "y*:crc32", &data)) {
        return NULL;
    }
    uint32_t crc = png_crc32(data.buf, (size_t)data.len);
    PyBuffer_Release(&data);
    return PyLong_FromUnsignedLong(crc);
}

static PyMethodDef png_rows_methods[] = {
    {"gather", gather, METH_VARARGS, "Check the chunks of a PNG file and copy its image data (IDAT) to a buffer."},
    {"crc32", crc32_of, METH_VARARGS, "The CRC-32 of a buffer, as the chunk checks compute it."},
    {"unfilter", unfilter, METH_VARARGS, "Reconstruct the filtered rows of inflated PNG image data into a buffer."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef png_rows_module = {
    PyModuleDef_HEAD_INIT, "_png_rows", "Compiled chunk reading and row filters of the PNG reader.", -1,
    png_rows_methods,
};

PyMODINIT_FUNC PyInit__png_rows(void)
{
#ifdef HAVE_X86_SIMD
    __builtin_cpu_init();
    clmul_available = __builtin_cpu_supports("pclmul");
    ssse3_available = __builtin_cpu_supports("ssse3");
#endif
    return PyModule_Create(&png_rows_module);
}
