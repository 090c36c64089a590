/* Frames of many data-only records in one call: the log's batch encoder, in C.
 *
 * Why C: framed one at a time in Python, a 1 KB record cost the log's batch append ~1 us of
 * CPU (two struct packs, two crc32c calls, a head object and two parts for writev), which held
 * the log at 30-45% of a plain file's rate on the project's VM. No library frames many
 * records with CRC32C in one call (the crc32c package checksums one buffer a call), and
 * numpy/pyarrow framing lost to the per-record loop end to end.
 *
 * The bytes are record_codec.py's, which documents the format:
 *     frame = length:u32 crc:u32 body;  body = index:u64 timestamp_ns:i64 flags:u8
 *             header_count:u16 data   (flags 0, header_count 0: no key, no headers)
 *     crc   = CRC32C (Castagnoli) of the body;  all integers little-endian.
 * CRC32C runs on the CPU's crc32 instruction where there is one (x86-64 with SSE4.2), else
 * on a table (slicing by 8). The Python encoder stays the reference and the fallback; the
 * tests hold both to the same bytes.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define HEAD_SIZE 27
#define PREFIX_SIZE 19
#define MAX_BODY (1u << 30)
/* A batch larger than this (the default segment size) is framed in Python, which writes the
 * records' data from where it is (writev): the C framer copies the batch once, and that much
 * memory again is not worth its CPU */
#define MAX_FRAMED ((size_t)64 << 20)

/* ---- CRC32C ------------------------------------------------------------------------- */
static uint32_t crc_table[8][256];

static void crc_init_tables(void) {
    for (uint32_t b = 0; b < 256; b++) {
        uint32_t c = b;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        crc_table[0][b] = c;
    }
    for (uint32_t b = 0; b < 256; b++)
        for (int t = 1; t < 8; t++)
            crc_table[t][b] = (crc_table[t - 1][b] >> 8) ^ crc_table[0][crc_table[t - 1][b] & 0xFF];
}

static uint32_t crc_sw(uint32_t crc, const unsigned char *p, size_t n) {
    while (n && ((uintptr_t)p & 7)) {
        crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xFF];
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        w ^= crc; /* little-endian hosts only: see the module's init */
        crc = crc_table[7][w & 0xFF] ^ crc_table[6][(w >> 8) & 0xFF] ^
              crc_table[5][(w >> 16) & 0xFF] ^ crc_table[4][(w >> 24) & 0xFF] ^
              crc_table[3][(w >> 32) & 0xFF] ^ crc_table[2][(w >> 40) & 0xFF] ^
              crc_table[1][(w >> 48) & 0xFF] ^ crc_table[0][w >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) crc = (crc >> 8) ^ crc_table[0][(crc ^ *p++) & 0xFF];
    return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HAVE_HW_CRC 1
__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const unsigned char *p,
                                                          size_t n) {
    uint64_t c = crc;
    while (n && ((uintptr_t)p & 7)) {
        c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
        n--;
    }
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = __builtin_ia32_crc32di(c, w);
        p += 8;
        n -= 8;
    }
    while (n--) c = __builtin_ia32_crc32qi((uint32_t)c, *p++);
    return (uint32_t)c;
}
#endif

typedef uint32_t (*crc_fn)(uint32_t, const unsigned char *, size_t);
static crc_fn crc_update = crc_sw;

/* ---- framing ------------------------------------------------------------------------- */
static void put_u16(unsigned char *p, uint16_t v) { p[0] = v & 0xFF; p[1] = v >> 8; }
static void put_u32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (v >> (8 * i)) & 0xFF;
}
static void put_u64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (v >> (8 * i)) & 0xFF;
}

/* frame_plain(datas, first_index, stamp, stamps=None) -> (bytes, offsets) or None
 *
 * datas: a list or tuple of bytes; records first_index, first_index + 1, ...; timestamps
 * stamp, or stamps[i] where stamps is given (a list or tuple of ints; stamp is then not read,
 * as the Python encoder does not read now_ns when every entry has its timestamp). None when
 * the batch is not for this path (an item that is not bytes, a record too large for a frame,
 * a timestamp that is not an int64): the caller frames it in Python, which names what is
 * wrong (a timestamp: InvalidTimestamp). */
static PyObject *frame_plain(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *datas, *first_obj, *stamp_obj, *stamps = Py_None;
    long long stamp = 0;
    if (!PyArg_ParseTuple(args, "OOO|O", &datas, &first_obj, &stamp_obj, &stamps)) return NULL;
    if (!PyList_Check(datas) && !PyTuple_Check(datas)) Py_RETURN_NONE;
    if (stamps == Py_None) {
        if (!PyLong_CheckExact(stamp_obj)) Py_RETURN_NONE;
        stamp = PyLong_AsLongLong(stamp_obj);
        if (stamp == -1 && PyErr_Occurred()) {
            PyErr_Clear(); /* not an int64: the Python encoder's error */
            Py_RETURN_NONE;
        }
    }
    unsigned long long first = PyLong_AsUnsignedLongLong(first_obj);
    if (first == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear(); /* negative or too large: the Python encoder's error */
        Py_RETURN_NONE;
    }
    /* a tuple of the items (the same tuple if one was given): they stay alive and in place
     * while the loop below runs without the GIL, whatever the caller's list does */
    PyObject *tup = PySequence_Tuple(datas);
    if (tup == NULL) return NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(tup);
    PyObject **items = &PyTuple_GET_ITEM(tup, 0);
    PyObject *result = NULL, *out = NULL, *offsets = NULL;
    int64_t *ts = NULL;
    if (n && first > UINT64_MAX - (unsigned long long)(n - 1)) goto none;
    size_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyBytes_CheckExact(items[i])) goto none;
        size_t len = (size_t)PyBytes_GET_SIZE(items[i]);
        if (len > MAX_BODY - PREFIX_SIZE) goto none;
        total += HEAD_SIZE + len;
        if (total > MAX_FRAMED) goto none;
    }
    if (stamps != Py_None) {
        if ((!PyList_Check(stamps) && !PyTuple_Check(stamps)) ||
            PySequence_Fast_GET_SIZE(stamps) != n)
            goto none;
        PyObject **ts_items = PySequence_Fast_ITEMS(stamps);
        ts = PyMem_Malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
        if (ts == NULL) {
            PyErr_NoMemory();
            goto done;
        }
        for (Py_ssize_t i = 0; i < n; i++) {
            /* exact ints only: converting anything else could run Python code that changes
             * the list under ``ts_items`` */
            if (!PyLong_CheckExact(ts_items[i])) goto none;
            ts[i] = PyLong_AsLongLong(ts_items[i]);
            if (ts[i] == -1 && PyErr_Occurred()) {
                PyErr_Clear(); /* not an int64: the Python encoder's error */
                goto none;
            }
        }
    }
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    offsets = PyList_New(n);
    if (out == NULL || offsets == NULL) goto done;
    size_t pos = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *o = PyLong_FromSize_t(pos);
        if (o == NULL) goto done;
        PyList_SET_ITEM(offsets, i, o);
        pos += HEAD_SIZE + (size_t)PyBytes_GET_SIZE(items[i]);
    }
    unsigned char *dst = (unsigned char *)PyBytes_AS_STRING(out);
    /* immutable bytes held by ``tup``: the loop needs no GIL, and another thread (the group
     * commit's fsync) may run meanwhile */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        const unsigned char *src = (const unsigned char *)PyBytes_AS_STRING(items[i]);
        size_t len = (size_t)PyBytes_GET_SIZE(items[i]);
        unsigned char *h = dst;
        put_u32(h, (uint32_t)(len + PREFIX_SIZE));
        put_u64(h + 8, (uint64_t)first + (uint64_t)i);
        put_u64(h + 16, (uint64_t)(ts ? ts[i] : stamp));
        h[24] = 0;
        put_u16(h + 25, 0);
        uint32_t crc = crc_update(0xFFFFFFFFu, h + 8, PREFIX_SIZE);
        crc = crc_update(crc, src, len) ^ 0xFFFFFFFFu;
        put_u32(h + 4, crc);
        memcpy(h + HEAD_SIZE, src, len);
        dst += HEAD_SIZE + len;
    }
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("(OO)", out, offsets);
    goto done;
none:
    result = Py_NewRef(Py_None);
done:
    Py_XDECREF(out);
    Py_XDECREF(offsets);
    PyMem_Free(ts);
    Py_DECREF(tup);
    return result;
}

/* crc32c(data) -> int: for the tests (the hardware and table paths against the package). */
static PyObject *crc32c_py(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    int table = 0;
    if (!PyArg_ParseTuple(args, "y*|p", &view, &table)) return NULL;
    crc_fn fn = table ? crc_sw : crc_update;
    uint32_t c = fn(0xFFFFFFFFu, view.buf, (size_t)view.len) ^ 0xFFFFFFFFu;
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(c);
}

static PyMethodDef methods[] = {
    {"frame_plain", frame_plain, METH_VARARGS,
     "frame_plain(datas, first_index, stamp, stamps=None) -> (bytes, offsets) or None"},
    {"crc32c", crc32c_py, METH_VARARGS, "crc32c(data, table=False) -> int"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_framing", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__framing(void) {
    const uint16_t one = 1;
    if (*(const unsigned char *)&one != 1) { /* the table path reads words little-endian */
        PyErr_SetString(PyExc_ImportError, "loglake.log._framing: little-endian hosts only");
        return NULL;
    }
    crc_init_tables();
#ifdef HAVE_HW_CRC
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2")) crc_update = crc_hw;
#endif
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddStringConstant(m, "crc_path", crc_update == crc_sw ? "table" : "sse4.2") < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
