/* The Cardinal Batch record's Avro decode, in C: loglake.cardinal.avro.decode_batch in one call.
 *
 * Why C: the block job decodes one Batch a block, and at one update a block the straight-line
 * Python decoder (avro.decode_batch_common) was about a third of the driver's block assembly
 * in a profile of the live run (a helper call a varint, a slice an item, a frozen dataclass an
 * entry). fastavro reads the record but not into the objects the assembler keys on, and its
 * per-call schema work costs more than the decode itself.
 *
 * The Python reader (avro.Reader / avro.decode_batch_reference) is the reference and the
 * fallback where this module is not built; this one answers exactly as it does:
 *   - the same value: (num, weight, parent, {key: BatchRecord}), keys decoded as UTF-8 with
 *     surrogateescape, a repeated key keeping its first place and its last value (a dict);
 *   - the same varints: unsigned LEB128 of at most 10 octets, non-minimal forms accepted, then
 *     zig-zag; a value beyond a long, or a count beyond an int, is an error;
 *   - both Avro block forms (a negative count followed by the block's byte size, or a positive
 *     count alone), the size checked against the bytes left, as the reference checks it;
 *   - for any other input, CardinalDecodeError("Batch", problem) with the reference's problem
 *     text, checked in the same order.
 * Every read is bounds-checked against the buffer; counts are bounded by the bytes left before
 * anything is allocated for them, so no input allocates more than a few times its own size.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>

#ifndef __SIZEOF_INT128__
/* the overflow message needs the 70-bit value a ten-octet varint spells; without a 128-bit
 * integer the build stops here and, the extension being optional, the Python reader decodes */
#error "a 128-bit integer type is needed (GCC or Clang on a 64-bit target)"
#endif

#define HASH_SIZE 32     /* spec "Message Payloads": parent and subbatch are fixed(32) */
#define MAX_OCTETS 10    /* the longest Avro long: ceil(64 / 7) (wire/varint.py MAX_OCTETS_64) */

static PyObject *error_cls;   /* loglake.cardinal.errors.CardinalDecodeError */
static PyObject *record_cls;  /* loglake.cardinal.messages.BatchRecord */
static PyObject *zero_hash;   /* messages.ZERO_HASH: one object for every unset subbatch */
static PyObject *empty_args;
/* BatchRecord's slot descriptors in field order (value, count, delete, subbatch): a frozen
 * dataclass's __init__ sets each through object.__setattr__, which is most of its cost; the
 * descriptors set the same slots directly. NULL: call the class instead. */
static PyObject *slots[4];

typedef struct {
    const unsigned char *p;
    Py_ssize_t n;
    Py_ssize_t pos;
} Cursor;

/* Raise CardinalDecodeError("Batch", problem). Always returns -1. */
static int fail(const char *format, ...) {
    va_list va;
    va_start(va, format);
    PyObject *problem = PyUnicode_FromFormatV(format, va);
    va_end(va);
    if (problem == NULL) return -1;
    PyObject *exc = PyObject_CallFunction(error_cls, "sO", "Batch", problem);
    Py_DECREF(problem);
    if (exc == NULL) return -1;
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    Py_DECREF(exc);
    return -1;
}

/* The decimal digits of a value of up to 127 bits, for the overflow message, which prints the
 * number the varint spells as the reference (a Python int) does. */
static void format_i128(__int128 v, char *out) {
    char digits[48];
    int i = 0, neg = v < 0;
    unsigned __int128 u = neg ? (unsigned __int128)(-(v + 1)) + 1 : (unsigned __int128)v;
    do {
        digits[i++] = (char)('0' + (int)(u % 10));
        u /= 10;
    } while (u);
    if (neg) digits[i++] = '-';
    int k = 0;
    while (i) out[k++] = digits[--i];
    out[k] = 0;
}

/* Avro long (avro.Reader.long): zig-zag of an unsigned LEB128 of at most 10 octets. */
static int read_long(Cursor *c, const char *field, int64_t *out) {
    Py_ssize_t start = c->pos, stop = c->n;
    if (stop - start > MAX_OCTETS) stop = start + MAX_OCTETS;
    uint64_t z = 0;
    int shift = 0;
    for (Py_ssize_t pos = start; pos < stop; pos++, shift += 7) {
        unsigned b = c->p[pos];
        z |= (uint64_t)(b & 0x7F) << shift; /* the tenth octet: only its low bit fits */
        if (b < 0x80) {
            if (shift == 63 && b > 1) {
                /* 2**64 or more: the reference's unzigzag gives a number beyond a long */
                unsigned __int128 w = ((unsigned __int128)b << 63) | (z & ~((uint64_t)1 << 63));
                __int128 n = (w & 1) ? -(__int128)(w >> 1) - 1 : (__int128)(w >> 1);
                char text[48];
                format_i128(n, text);
                return fail("%s: %s overflows a long", field, text);
            }
            c->pos = pos + 1;
            *out = (int64_t)((z >> 1) ^ (0 - (z & 1)));
            return 0;
        }
    }
    if (stop - start >= MAX_OCTETS) return fail("%s: varint longer than 10 bytes", field);
    return fail("%s: varint runs past the end", field);
}

/* avro.Reader.raw: the next `size` bytes, or an error naming how many are left */
static int need(Cursor *c, int64_t size, const char *field) {
    if (size < 0 || size > c->n - c->pos)
        return fail("%s: needs %lld bytes, %zd left", field, (long long)size, c->n - c->pos);
    return 0;
}

/* avro.Reader.bytes_: a long length, then that many bytes (a new bytes object) */
static PyObject *read_bytes(Cursor *c, const char *field) {
    int64_t n;
    if (read_long(c, field, &n) < 0) return NULL;
    if (n < 0) {
        fail("%s: negative length %lld", field, (long long)n);
        return NULL;
    }
    if (need(c, n, field) < 0) return NULL;
    PyObject *b = PyBytes_FromStringAndSize((const char *)c->p + c->pos, (Py_ssize_t)n);
    c->pos += (Py_ssize_t)n;
    return b;
}

static PyObject *new_record(PyObject *value, PyObject *count, PyObject *delete,
                            PyObject *subbatch) {
    if (slots[0] == NULL)
        return PyObject_CallFunctionObjArgs(record_cls, value, count, delete, subbatch, NULL);
    PyTypeObject *t = (PyTypeObject *)record_cls;
    PyObject *rec = t->tp_new(t, empty_args, NULL);
    if (rec == NULL) return NULL;
    PyObject *fields[4] = {value, count, delete, subbatch};
    for (int i = 0; i < 4; i++) {
        if (Py_TYPE(slots[i])->tp_descr_set(slots[i], rec, fields[i]) < 0) {
            Py_DECREF(rec);
            return NULL;
        }
    }
    return rec;
}

/* One entry of the updates map (Avro record ``update``), added to `updates`. */
static int read_entry(Cursor *c, PyObject *updates) {
    int64_t n;
    if (read_long(c, "updates key", &n) < 0) return -1;
    if (n < 0) return fail("updates key: negative length %lld", (long long)n);
    if (need(c, n, "updates key") < 0) return -1;
    PyObject *key = PyUnicode_DecodeUTF8((const char *)c->p + c->pos, (Py_ssize_t)n,
                                         "surrogateescape");
    if (key == NULL) return -1;
    c->pos += (Py_ssize_t)n;
    PyObject *value = NULL, *count = NULL, *subbatch = NULL, *rec = NULL;
    int rc = -1;
    value = read_bytes(c, "update.value");
    if (value == NULL) goto done;
    if (read_long(c, "update.count", &n) < 0) goto done;
    if (n < INT32_MIN || n > INT32_MAX) {
        fail("update.count: %lld overflows an int", (long long)n);
        goto done;
    }
    count = PyLong_FromLongLong(n);
    if (count == NULL) goto done;
    if (need(c, 1, "update.delete") < 0) goto done;
    unsigned flag = c->p[c->pos++];
    if (flag > 1) {
        fail("update.delete: boolean byte %u is neither 0 nor 1", flag);
        goto done;
    }
    if (need(c, HASH_SIZE, "update.subbatch") < 0) goto done;
    static const unsigned char zeros[HASH_SIZE];
    if (memcmp(c->p + c->pos, zeros, HASH_SIZE) == 0) {
        subbatch = Py_NewRef(zero_hash);
    } else {
        subbatch = PyBytes_FromStringAndSize((const char *)c->p + c->pos, HASH_SIZE);
        if (subbatch == NULL) goto done;
    }
    c->pos += HASH_SIZE;
    rec = new_record(value, count, flag ? Py_True : Py_False, subbatch);
    if (rec == NULL) goto done;
    rc = PyDict_SetItem(updates, key, rec);
done:
    Py_DECREF(key);
    Py_XDECREF(value);
    Py_XDECREF(count);
    Py_XDECREF(subbatch);
    Py_XDECREF(rec);
    return rc;
}

static int read_updates(Cursor *c, PyObject *updates) {
    for (;;) {
        int64_t count;
        if (read_long(c, "updates block count", &count) < 0) return -1;
        if (count == 0) return 0;
        uint64_t items = (uint64_t)count; /* -INT64_MIN is 2**63: unsigned, as a Python int */
        if (count < 0) {
            items = 0 - (uint64_t)count;
            int64_t size;
            if (read_long(c, "updates block size", &size) < 0) return -1;
            if (size < 0 || size > c->n - c->pos)
                return fail("updates: block size %lld runs past the end", (long long)size);
        }
        if (items > (uint64_t)(c->n - c->pos))
            return fail("updates: %llu items cannot fit in the bytes left",
                        (unsigned long long)items);
        for (uint64_t i = 0; i < items; i++)
            if (read_entry(c, updates) < 0) return -1;
    }
}

PyDoc_STRVAR(decode_batch_doc,
             "decode_batch(data) -> (num, weight, parent, {key: BatchRecord})\n\n"
             "Record cloud.rivet.cardinal.batch from Avro binary, as avro.decode_batch_reference "
             "reads it; CardinalDecodeError for anything it refuses, with the same text.");

static PyObject *decode_batch(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) return NULL;
    Cursor c = {(const unsigned char *)view.buf, view.len, 0};
    PyObject *number = NULL, *weight = NULL, *parent = NULL, *updates = NULL, *out = NULL;
    int64_t n;
    if (read_long(&c, "num", &n) < 0) goto done;
    number = PyLong_FromLongLong(n);
    if (number == NULL) goto done;
    weight = read_bytes(&c, "weight");
    if (weight == NULL) goto done;
    if (need(&c, HASH_SIZE, "parent") < 0) goto done;
    parent = PyBytes_FromStringAndSize((const char *)c.p + c.pos, HASH_SIZE);
    if (parent == NULL) goto done;
    c.pos += HASH_SIZE;
    updates = PyDict_New();
    if (updates == NULL || read_updates(&c, updates) < 0) goto done;
    if (c.pos != c.n) {
        fail("%zd trailing bytes", c.n - c.pos);
        goto done;
    }
    out = PyTuple_Pack(4, number, weight, parent, updates);
done:
    PyBuffer_Release(&view);
    Py_XDECREF(number);
    Py_XDECREF(weight);
    Py_XDECREF(parent);
    Py_XDECREF(updates);
    return out;
}

static PyMethodDef methods[] = {
    {"decode_batch", decode_batch, METH_O, decode_batch_doc},
    {NULL, NULL, 0, NULL},
};

static PyObject *attr_of(const char *module, const char *name) {
    PyObject *m = PyImport_ImportModule(module);
    if (m == NULL) return NULL;
    PyObject *v = PyObject_GetAttrString(m, name);
    Py_DECREF(m);
    return v;
}

/* The slot descriptors, where BatchRecord is the slotted dataclass this module was written
 * for; otherwise slots[0] stays NULL and records are made by calling the class. */
static int find_slots(void) {
    static const char *names[4] = {"value", "count", "delete", "subbatch"};
    PyObject *found[4] = {NULL, NULL, NULL, NULL};
    int ok = PyType_Check(record_cls) &&
             ((PyTypeObject *)record_cls)->tp_new == PyBaseObject_Type.tp_new;
    for (int i = 0; ok && i < 4; i++) {
        found[i] = PyObject_GetAttrString(record_cls, names[i]);
        if (found[i] == NULL) return -1;
        ok = Py_IS_TYPE(found[i], &PyMemberDescr_Type);
    }
    for (int i = 0; i < 4; i++) {
        if (ok)
            slots[i] = found[i];
        else
            Py_XDECREF(found[i]);
    }
    return 0;
}

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_avro",
                                    "The Cardinal Batch record's Avro decode in C.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__avro(void) {
    error_cls = attr_of("loglake.cardinal.errors", "CardinalDecodeError");
    if (error_cls == NULL) return NULL;
    record_cls = attr_of("loglake.cardinal.messages", "BatchRecord");
    if (record_cls == NULL) return NULL;
    zero_hash = attr_of("loglake.cardinal.messages", "ZERO_HASH");
    if (zero_hash == NULL) return NULL;
    if (!PyBytes_Check(zero_hash) || PyBytes_GET_SIZE(zero_hash) != HASH_SIZE) {
        PyErr_SetString(PyExc_ImportError, "messages.ZERO_HASH is not 32 zero bytes");
        return NULL;
    }
    empty_args = PyTuple_New(0);
    if (empty_args == NULL || find_slots() < 0) return NULL;
    return PyModule_Create(&module);
}
