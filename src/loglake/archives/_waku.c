/* WakuMessage records of an Arrow binary column, read field by field and framed, in C: the two
 * per-byte loops of `job archives-build`'s scan.
 *
 * Why C: the scan reads every record of a community stream once. In numpy
 * (archives/columnar.py, `_read_fields_numpy`) each protobuf field of a batch costs two
 * vectorised varint passes and a handful of masks and gathers over every record: about a third
 * of the scan's CPU on 300-byte messages. The bytes of each archive (`0x1a varint(len) record`
 * per message) were joined by pyarrow's `binary_join_element_wise` after numpy built the
 * prefixes (`_framed` in pipeline/jobs/archives_build.py): one more pass and a copy. Here each
 * record is walked once, with no per-record Python object; the numpy paths stay the reference
 * and the fallback (no compiler), and the tests hold both to the same results on hostile bytes.
 *
 * fields(data, offsets, slots, wires, seen, value, length, ok): what `_read_fields_numpy`
 * returns, written into the caller's buffers. `data` is the column's value buffer, `offsets`
 * its n + 1 int32 offsets (already at the array's offset); `slots[num]` is the output slot of
 * field number num (255: not a schema field) for num < 256, `wires[slot]` the wire type the
 * schema gives it. For record i and slot s: seen[i*S+s] = 1 when the record holds the field;
 * value[i*S+s] its varint value, or for a length-delimited field its start in `data`;
 * length[i*S+s] its length. ok[i] = 0 when the record is not made only of schema fields with
 * their wire types, each at most once, every varint at most 10 octets and 64 bits, every length
 * at most 2^31 and inside the record (protobuf's own rules, except that protobuf keeps the last
 * of a repeated field: such a record is left to the layout's decode_record, as the numpy path
 * does). Offsets that are decreasing or past `data` mark the record not ok (never read).
 *
 * topic_codes(data, starts, lengths, codes, max_distinct) -> list[bytes] | None: the distinct
 * values of the slices data[starts[i] : starts[i] + lengths[i]] (n int64 each), in order of
 * first appearance, with codes[i] (n int32, written) the index of slice i's value among them:
 * a dictionary encoding of a batch's topics without a binary array of n values first. None
 * when there are more than max_distinct values (a linear search each: the caller takes
 * another way) or a slice is not inside data.
 *
 * frame(data, offsets) -> (bytes, bytes): every record as `0x1a varint(len) record` (the spec
 * layout's archive holds its messages as field 3 of WakuMessageArchive), concatenated, and the
 * n + 1 int64 offsets of those frames: a large_binary array's two buffers. None when an
 * offset is decreasing or past `data`.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_VARINT 10
#define MAX_TAG 5 /* octets of a field tag upb reads (a 32-bit varint); more is a bad record */
#define MAX_LEN ((uint64_t)1 << 31)
#define NO_SLOT 255

/* One unsigned LEB128 at p, below end: at most 10 octets, at most 64 bits (a tenth octet of
 * 0 or 1). Returns the position after it, or NULL. */
static const unsigned char *uleb(const unsigned char *p, const unsigned char *end, uint64_t *out) {
    uint64_t v = 0;
    for (int k = 0; k < MAX_VARINT; k++) {
        if (p >= end) return NULL;
        unsigned char b = *p++;
        if (k == MAX_VARINT - 1 && b > 1) return NULL;
        v |= (uint64_t)(b & 0x7F) << (7 * k);
        if (b < 0x80) {
            *out = v;
            return p;
        }
    }
    return NULL;
}

static int writable(Py_buffer *b, Py_ssize_t need, const char *name) {
    if (b->len < need) {
        PyErr_Format(PyExc_ValueError, "%s holds %zd bytes, %zd needed", name, b->len, need);
        return 0;
    }
    return 1;
}

static PyObject *fields(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer data, offs, slots, wires, seen, value, length, ok;
    if (!PyArg_ParseTuple(args, "y*y*y*y*w*w*w*w*", &data, &offs, &slots, &wires, &seen, &value,
                          &length, &ok))
        return NULL;
    PyObject *res = NULL;
    Py_ssize_t n = offs.len / 4 - 1;
    Py_ssize_t ns = wires.len;
    if (offs.len % 4 || n < 0) {
        PyErr_SetString(PyExc_ValueError, "offsets: n + 1 int32 values");
        goto done;
    }
    if (slots.len != 256 || ns < 1 || ns >= NO_SLOT) {
        PyErr_SetString(PyExc_ValueError, "slots: 256 octets; wires: one octet per slot");
        goto done;
    }
    const unsigned char *slot = slots.buf, *wire = wires.buf;
    for (int num = 0; num < 256; num++) {
        if (slot[num] != NO_SLOT && slot[num] >= ns) {
            PyErr_SetString(PyExc_ValueError, "slots: a slot past wires");
            goto done;
        }
    }
    if (!writable(&seen, n * ns, "seen") || !writable(&value, n * ns * 8, "value") ||
        !writable(&length, n * ns * 8, "length") || !writable(&ok, n, "ok"))
        goto done;
    const unsigned char *base = data.buf;
    const int32_t *off = offs.buf;
    unsigned char *sn = seen.buf, *okb = ok.buf;
    uint64_t *val = value.buf;
    int64_t *len = length.buf;
    memset(sn, 0, (size_t)(n * ns));
    memset(val, 0, (size_t)(n * ns) * 8);
    memset(len, 0, (size_t)(n * ns) * 8);
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t a = off[i], z = off[i + 1];
        okb[i] = 0;
        if (a < 0 || z < a || (Py_ssize_t)z > data.len) continue;
        const unsigned char *p = base + a, *end = base + z;
        unsigned char *rs = sn + i * ns;
        uint64_t *rv = val + i * ns;
        int64_t *rl = len + i * ns;
        int good = 1;
        while (p < end) {
            uint64_t tag, v;
            const unsigned char *at = p;
            p = uleb(p, end, &tag);
            if (p == NULL || p - at > MAX_TAG || (tag >> 3) > 255) {
                good = 0;
                break;
            }
            unsigned s = slot[tag >> 3];
            unsigned wt = (unsigned)(tag & 7);
            if (s == NO_SLOT || wire[s] != wt || rs[s]) { /* unknown, other type, repeated */
                good = 0;
                break;
            }
            p = uleb(p, end, &v);
            if (p == NULL) {
                good = 0;
                break;
            }
            if (wt == 2) {
                if (v > MAX_LEN || v > (uint64_t)(end - p)) {
                    good = 0;
                    break;
                }
                rv[s] = (uint64_t)(p - base);
                rl[s] = (int64_t)v;
                p += v;
            } else {
                rv[s] = v;
            }
            rs[s] = 1;
        }
        okb[i] = (unsigned char)good;
    }
    Py_END_ALLOW_THREADS
    res = Py_None;
    Py_INCREF(res);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&offs);
    PyBuffer_Release(&slots);
    PyBuffer_Release(&wires);
    PyBuffer_Release(&seen);
    PyBuffer_Release(&value);
    PyBuffer_Release(&length);
    PyBuffer_Release(&ok);
    return res;
}

static int uleb_size(uint64_t v) {
    int k = 1;
    while (v >= 0x80) {
        v >>= 7;
        k++;
    }
    return k;
}

static PyObject *frame(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer data, offs;
    if (!PyArg_ParseTuple(args, "y*y*", &data, &offs)) return NULL;
    PyObject *res = NULL, *out = NULL, *outoffs = NULL;
    Py_ssize_t n = offs.len / 4 - 1;
    if (offs.len % 4 || n < 0) {
        PyErr_SetString(PyExc_ValueError, "offsets: n + 1 int32 values");
        goto done;
    }
    const int32_t *off = offs.buf;
    size_t total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        int32_t a = off[i], z = off[i + 1];
        if (a < 0 || z < a || (Py_ssize_t)z > data.len) {
            res = Py_None;
            Py_INCREF(res);
            goto done;
        }
        total += 1 + (size_t)uleb_size((uint64_t)(z - a)) + (size_t)(z - a);
    }
    out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)total);
    outoffs = PyBytes_FromStringAndSize(NULL, (n + 1) * 8);
    if (out == NULL || outoffs == NULL) goto done;
    unsigned char *q = (unsigned char *)PyBytes_AS_STRING(out);
    int64_t *qo = (int64_t *)PyBytes_AS_STRING(outoffs);
    const unsigned char *base = data.buf;
    Py_BEGIN_ALLOW_THREADS
    int64_t at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        uint64_t m = (uint64_t)(off[i + 1] - off[i]);
        qo[i] = at;
        unsigned char *start = q;
        *q++ = 0x1A;
        uint64_t v = m;
        while (v >= 0x80) {
            *q++ = (unsigned char)(v | 0x80);
            v >>= 7;
        }
        *q++ = (unsigned char)v;
        memcpy(q, base + off[i], (size_t)m);
        q += m;
        at += (int64_t)(q - start);
    }
    qo[n] = at;
    Py_END_ALLOW_THREADS
    res = PyTuple_Pack(2, out, outoffs);
done:
    Py_XDECREF(out);
    Py_XDECREF(outoffs);
    PyBuffer_Release(&data);
    PyBuffer_Release(&offs);
    return res;
}

static PyObject *topic_codes(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer data, starts, lengths, codes;
    Py_ssize_t max_distinct;
    if (!PyArg_ParseTuple(args, "y*y*y*w*n", &data, &starts, &lengths, &codes, &max_distinct))
        return NULL;
    PyObject *res = NULL;
    Py_ssize_t n = starts.len / 8;
    const unsigned char *base = data.buf;
    const int64_t *st = starts.buf, *ln = lengths.buf;
    int32_t *code = codes.buf;
    if (starts.len % 8 || lengths.len != starts.len || codes.len < n * 4 || max_distinct < 1 ||
        max_distinct > 4096) {
        PyErr_SetString(PyExc_ValueError, "starts, lengths: n int64 values; codes: n int32; "
                                          "1 <= max_distinct <= 4096");
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) { /* every slice inside data, or no answer */
        if (st[i] < 0 || ln[i] < 0 || st[i] > (int64_t)data.len ||
            ln[i] > (int64_t)data.len - st[i]) {
            res = Py_None;
            Py_INCREF(res);
            goto done;
        }
    }
    /* distinct values as (start, length) of their first record; a record is compared with the
     * record before it first (a batch's records mostly share one topic), then with each value */
    int64_t *dst = PyMem_Malloc((size_t)max_distinct * 2 * sizeof(int64_t));
    if (dst == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t nd = 0;
    int too_many = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t a = st[i], m = ln[i];
        if (i > 0 && ln[i - 1] == m && memcmp(base + st[i - 1], base + a, (size_t)m) == 0) {
            code[i] = code[i - 1];
            continue;
        }
        Py_ssize_t k = 0;
        while (k < nd &&
               !(dst[2 * k + 1] == m && memcmp(base + dst[2 * k], base + a, (size_t)m) == 0))
            k++;
        if (k == nd) {
            if (nd == max_distinct) {
                too_many = 1;
                break;
            }
            dst[2 * nd] = a;
            dst[2 * nd + 1] = m;
            nd++;
        }
        code[i] = (int32_t)k;
    }
    Py_END_ALLOW_THREADS
    if (too_many) {
        res = Py_None;
        Py_INCREF(res);
    } else {
        res = PyList_New(nd);
        for (Py_ssize_t k = 0; res != NULL && k < nd; k++) {
            PyObject *v = PyBytes_FromStringAndSize((const char *)base + dst[2 * k],
                                                    (Py_ssize_t)dst[2 * k + 1]);
            if (v == NULL) {
                Py_CLEAR(res);
                break;
            }
            PyList_SET_ITEM(res, k, v);
        }
    }
    PyMem_Free(dst);
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&lengths);
    PyBuffer_Release(&codes);
    return res;
}

static PyMethodDef methods[] = {
    {"fields", fields, METH_VARARGS,
     "fields(data, offsets, slots, wires, seen, value, length, ok) -> None"},
    {"frame", frame, METH_VARARGS, "frame(data, offsets) -> (bytes, int64 offsets) or None"},
    {"topic_codes", topic_codes, METH_VARARGS,
     "topic_codes(data, starts, lengths, codes, max_distinct) -> list of bytes or None"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_waku", NULL, -1, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__waku(void) { return PyModule_Create(&module); }
