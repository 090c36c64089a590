/* The sds-audit decoder's batch kernel, in C: a batch of SdsMessage records walked in one call.
 *
 * Why C: the decode read ~20 KB records with 200-entry causal histories; numpy rounds over the
 * column's buffers (one round per field of every record) and Arrow's hash table for the
 * entries left it at ~100 us of CPU a record, most of it in per-round and per-batch overheads
 * that no vectorised formulation removes. A walk of the protobuf in C is one pass over the
 * bytes.
 *
 * What it vouches for, and nothing more: records made only of SdsMessage's fields
 * (src/loglake/wire/proto/sds.proto) with their wire types, each singular field at most once,
 * every varint minimal and every length inside its record, ids ASCII (then protobuf's UTF-8
 * check passes and characters are bytes), history and repair entries made only of
 * HistoryEntry's fields likewise, and every check of sds.codec.parse / parse_entry and of the
 * decoder's own (channel, bloom filter length, lamport below 2^63) passed, and, when asked
 * (verify_ids), a content message's id the lowercase hex SHA-256 of its content (a
 * participant drops any other: participant.py, difference 8). Any other record
 * is flagged, and the Python side reads it with the per-record reference path
 * (loglake.sds.columnar.DecodeState._decode_row), which names its reason exactly as a
 * participant would. Every read is bounds-checked against its record. A bloom filter with
 * more than max_bloom_bits bits set (when >= 0) is read as none (R_BLOOM_AT -1): it
 * acknowledges nothing, as a participant counts it (participant.py, difference 10).
 *
 * Five calls to decode:
 *   scan(offsets, data, channel, bloom_bytes, limits, rec[, alloc[, verify_ids[,
 *     max_bloom_bits]]]) -> (entries, requests);
 *     a history that starts with the entries of its sender's last record scan vouched for in
 *     the batch, byte for byte, is compared as one run instead of walked (earlier_run; R_RUN)
 *   causal(state, data, extra, ok, sender, index, hist_end, entries, runs[, hints]) -> new (one
 *     octet an entry); runs (int32, 3 a record, written): where a history starts with a run of
 *     its sender's previous message's entries in the batch (rows back, its first entry,
 *     length); hints (int64, 3 a record: scan's R_RUN_ROW, R_RUN_FROM, R_RUN): the runs scan
 *     already compared, taken as they are where they are a run of the row's previous message
 *     to its last entry (the bytes are not compared again: the caller passes scan's own)
 *   gather(data, extra, at, len) -> the spans' bytes concatenated
 *   lists(data, extra, spans, width, ends, ok, keep[, alloc[, skip]]) -> list<string> buffers of
 *     the ids
 *   list_codes(the same) -> those ids dictionary-encoded (the stored histories, causal_new)
 * two for the readers of the decoded rows (unpack: whole histories from causal's runs;
 * unpack_codes: the same as a code an entry, for a dictionary-encoded column) and two
 * for the sweep that reads them (id_table, id_lookup: ids looked up in a set of ids, as
 * pyarrow's index_in, with the set's hash table kept from one call to the next), and
 * id_hashes for the driver's first copies (columnar.first_rows).
 * Positions handed to causal and gather address data, then extra after it (as if the two were
 * concatenated): the records the reference path read carry their ids in extra.
 *
 * alloc: where scan and lists put their large outputs (a batch's entries, ~20 MB, and its
 * history ids, ~40 MB, for 3,000 records of 200-entry histories). Without it they are bytes
 * objects, from malloc; glibc serves blocks over its mmap threshold (at most 32 MB) with a
 * fresh mmap each time, so every batch faulted its output in page by page (about a third of a
 * decode task's CPU time was system time, measured). The caller passes the Arrow memory
 * pool's allocate_buffer, which keeps and reuses freed memory, and the arrays the outputs
 * become are Arrow's own buffers anyway.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

/* rec's columns (int64 each), one row per record: the Python side names them the same */
enum {
    R_FLAG,        /* 1: the reference path reads this record */
    R_SENDER_AT,
    R_SENDER_LEN,
    R_MID_AT,
    R_MID_LEN,
    R_LAMPORT,     /* lamport_timestamp when R_HAS_LAMPORT */
    R_HAS_LAMPORT,
    R_BLOOM_AT,    /* -1: no bloom_filter field */
    R_CONTENT_LEN, /* -1: no content field */
    R_HIST_END,    /* entries of this record and those before it */
    R_REQ_END,     /* likewise repair requests */
    R_RUN,         /* history entries taken as one run of an earlier record's (earlier_run) */
    R_RUN_ROW,     /* that record's row */
    R_RUN_FROM,    /* the run's first entry among that record's */
    R_FIELDS
};

typedef struct {
    Py_ssize_t max_message, max_id, max_hint, max_content, max_history, max_requests;
} Limits;

/* A growable array of int64 */
typedef struct {
    int64_t *v;
    Py_ssize_t n, cap;
} Vec;

/* Room for k more */
static int vec_reserve(Vec *a, Py_ssize_t k) {
    if (a->n + k > a->cap) {
        Py_ssize_t cap = a->cap ? 2 * a->cap : 1 << 16;
        int64_t *v = realloc(a->v, (size_t)cap * sizeof(int64_t));
        if (!v) return -1;
        a->v = v;
        a->cap = cap;
    }
    return 0;
}

/* A minimal varint of at most 10 octets inside [p, e), its value < 2^64: 1 and *p moved past
 * it; else 0 (the record is flagged: protobuf may still read a longer encoding) */
static inline int varint(const uint8_t **pp, const uint8_t *e, uint64_t *out) {
    const uint8_t *p = *pp;
    if (p < e && *p < 0x80) { /* one octet: an id's or an entry's length */
        *out = *p;
        *pp = p + 1;
        return 1;
    }
    uint64_t v = 0;
    for (int i = 0; i < 10; i++) {
        if (p >= e) return 0;
        uint8_t b = *p++;
        if (i == 9 && b > 1) return 0;
        v |= (uint64_t)(b & 0x7f) << (7 * i);
        if (!(b & 0x80)) {
            if (b == 0 && i > 0) return 0; /* over-long */
            *pp = p;
            *out = v;
            return 1;
        }
    }
    return 0;
}

/* A length-delimited field's body: 1 and [*at, *at + *len) inside [p, e) */
static inline int body(const uint8_t **pp, const uint8_t *e, const uint8_t **at, Py_ssize_t *len) {
    uint64_t n;
    if (!varint(pp, e, &n) || n > (uint64_t)(e - *pp)) return 0;
    *at = *pp;
    *len = (Py_ssize_t)n;
    *pp += n;
    return 1;
}

static int ascii(const uint8_t *p, Py_ssize_t n) {
    uint64_t w, any = 0;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        memcpy(&w, p + i, 8);
        any |= w;
    }
    for (; i < n; i++) any |= p[i];
    return !(any & 0x8080808080808080ull);
}

/* One HistoryEntry body: 1 and its message_id's span when parse_entry accepts it with the
 * ids ASCII; 0 for anything else */
static int entry(const uint8_t *p, const uint8_t *e, const Limits *lim, const uint8_t **id,
                 Py_ssize_t *id_len) {
    int seen[4] = {0, 0, 0, 0};
    *id = NULL;
    *id_len = 0;
    while (p < e) {
        uint8_t tag = *p++;
        int f = tag == 0x0a ? 1 : tag == 0x12 ? 2 : tag == 0x1a ? 3 : 0;
        const uint8_t *at;
        Py_ssize_t n;
        if (!f || seen[f] || !body(&p, e, &at, &n)) return 0;
        seen[f] = 1;
        if (f == 2) {
            if (n > lim->max_hint) return 0;
        } else {
            if (n > lim->max_id || !ascii(at, n)) return 0;
            if (f == 1) {
                *id = at;
                *id_len = n;
            }
        }
    }
    return *id_len > 0;
}

/* An output buffer of n octets: alloc(n), a writable buffer, when the caller gives an
 * allocator, else a bytes object. The view stays held until out_release. 0, or -1 with an
 * exception set. */
typedef struct {
    PyObject *obj;
    char *w;
    Py_buffer view;
    int held;
} Out;

static int out_new(Out *o, PyObject *alloc, Py_ssize_t n) {
    if (!alloc || alloc == Py_None) {
        o->obj = PyBytes_FromStringAndSize(NULL, n);
        if (!o->obj) return -1;
        o->w = PyBytes_AS_STRING(o->obj);
        return 0;
    }
    o->obj = PyObject_CallFunction(alloc, "n", n);
    if (!o->obj) return -1;
    if (PyObject_GetBuffer(o->obj, &o->view, PyBUF_WRITABLE) < 0) {
        Py_CLEAR(o->obj);
        return -1;
    }
    o->held = 1;
    if (o->view.len < n) {
        PyErr_SetString(PyExc_ValueError, "alloc: a buffer shorter than asked for");
        PyBuffer_Release(&o->view);
        o->held = 0;
        Py_CLEAR(o->obj);
        return -1;
    }
    o->w = o->view.buf;
    return 0;
}

/* The view released; the object (a new reference, NULL after an error) is the caller's */
static PyObject *out_release(Out *o) {
    if (o->held) PyBuffer_Release(&o->view);
    o->held = 0;
    return o->obj;
}

static PyObject *vec_bytes(Vec *a, PyObject *alloc) {
    Out o = {0};
    Py_ssize_t n = a->n * (Py_ssize_t)sizeof(int64_t);
    if (out_new(&o, alloc, n)) return NULL;
    if (n) memcpy(o.w, a->v, (size_t)n);
    return out_release(&o);
}

/* scan's entry and request arrays, kept from one call to the next (a task calls it once a
 * batch, holding the GIL throughout): their growth by realloc faulted in fresh pages for every
 * batch. Let go of past KEEP_BYTES, so one huge batch does not pin its memory. */
static Vec kept_ents, kept_reqs;
#define KEEP_BYTES ((Py_ssize_t)256 << 20)

static void vec_keep(Vec *kept, Vec *a) {
    if (a->cap * (Py_ssize_t)sizeof(int64_t) > KEEP_BYTES) {
        free(a->v);
        *a = (Vec){0};
    }
    a->n = 0;
    *kept = *a;
}

/* scan's vouched records by sender, for earlier_run: sender bytes -> the last record of that
 * sender it vouched for in this batch (an open-addressing table, rebuilt every call) */
typedef struct {
    const uint8_t *at;
    Py_ssize_t len;
    Py_ssize_t row;
} Seen;

typedef struct {
    Seen *slot; /* row -1: empty */
    size_t mask;
    const int64_t *rows; /* rec: each row's R_HIST_END, for its entries' range */
} Vouched;

static uint64_t bytes_hash(const uint8_t *p, Py_ssize_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (Py_ssize_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static Seen *vouched_at(const Vouched *v, const uint8_t *at, Py_ssize_t len) {
    size_t h = (size_t)bytes_hash(at, len) & v->mask;
    while (v->slot[h].row >= 0 &&
           (v->slot[h].len != len || memcmp(v->slot[h].at, at, (size_t)len)))
        h = (h + 1) & v->mask;
    return &v->slot[h];
}

static Py_ssize_t uleb_len(uint64_t v) {
    Py_ssize_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* How many history entries start at x (a field boundary of the record being walked, its
 * first history entry's tag; e its end) as one run of bytes equal to the entries of the same
 * sender's last vouched record in this batch from the one equal to x's first entry to its
 * last, laid out end to end: their entries appended to ents (their positions moved to x's
 * bytes) and *next set past them. 0 (nothing appended) when there is none.
 *
 * Why: a history mostly repeats its sender's previous one (a window sliding over the
 * channel), so one compare of ~20 KB replaces walking ~200 entries field by field. Exact:
 * the earlier record's entries were each walked and passed every check entry() makes, and
 * those checks read only the entry's own bytes; the run's bytes are theirs, one after another
 * with nothing between (each entry starts where the one before ends), so a walk of them would
 * see the same fields and give the same verdicts, ending on a field boundary at *next. The
 * record's other checks (the count of entries, its other fields) are made as before.
 * row: R_RUN_ROW and R_RUN_FROM set (the earlier record, its entry the run starts at). */
static Py_ssize_t earlier_run(const Vouched *v, const uint8_t *data, const uint8_t *sender,
                              Py_ssize_t sender_len, const uint8_t *x, const uint8_t *e,
                              Vec *ents, const uint8_t **next, int64_t *row) {
    if (!v || !sender) return 0;
    Seen *s = vouched_at(v, sender, sender_len);
    if (s->row < 0) return 0;
    Py_ssize_t q = s->row;
    int64_t lo = q ? v->rows[(q - 1) * R_FIELDS + R_HIST_END] : 0;
    int64_t hi = v->rows[q * R_FIELDS + R_HIST_END];
    const uint8_t *p = x + 1; /* x's first entry: its body */
    const uint8_t *at;
    Py_ssize_t n;
    if (hi - lo < 2 || !body(&p, e, &at, &n)) return 0;
    int64_t i0 = lo;
    for (; i0 < hi; i0++) {
        const int64_t *w = ents->v + 4 * i0;
        if (w[1] == n && !memcmp(data + w[0], at, (size_t)n)) break;
    }
    if (i0 >= hi - 1) return 0; /* none, or one entry: walking it costs no more */
    const int64_t *first = ents->v + 4 * i0;
    int64_t start = first[0] - 1 - uleb_len((uint64_t)first[1]), end = start;
    for (int64_t i = i0; i < hi; i++) { /* each entry where the one before ends */
        const int64_t *w = ents->v + 4 * i;
        if (w[0] - 1 - uleb_len((uint64_t)w[1]) != end) return 0;
        end = w[0] + w[1];
    }
    int64_t len = end - start;
    if (len > e - x || memcmp(x, data + start, (size_t)len)) return 0;
    Py_ssize_t k = (Py_ssize_t)(hi - i0);
    if (vec_reserve(ents, 4 * k)) return -1;
    int64_t shift = (x - data) - start, *w = ents->v + ents->n;
    const int64_t *r = ents->v + 4 * i0; /* after the reserve: it may have moved */
    for (Py_ssize_t i = 0; i < 4 * k; i += 4) {
        w[i] = r[i] + shift;
        w[i + 1] = r[i + 1];
        w[i + 2] = r[i + 2] + shift;
        w[i + 3] = r[i + 3];
    }
    ents->n += 4 * k;
    *next = x + len;
    row[R_RUN_ROW] = q;
    row[R_RUN_FROM] = i0 - lo;
    return k;
}

/* SHA-256 (FIPS 180-4), for the message id check: ids are the hex SHA-256 of a content
 * message's content (messages.message_id_of), a few dozen octets each, so one plain
 * implementation costs little beside the walk (~0.3 us a record, measured); no library is
 * linked (the kernel builds wherever a C compiler is). */
static const uint32_t SHA256_K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

#define ROTR32(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha256_block(uint32_t h[8], const uint8_t *p) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | (uint32_t)p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROTR32(w[i - 15], 7) ^ ROTR32(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROTR32(w[i - 2], 17) ^ ROTR32(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = k + (ROTR32(e, 6) ^ ROTR32(e, 11) ^ ROTR32(e, 25)) + ((e & f) ^ (~e & g)) +
                      SHA256_K[i] + w[i];
        uint32_t t2 =
            (ROTR32(a, 2) ^ ROTR32(a, 13) ^ ROTR32(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a;
    h[1] += b;
    h[2] += c;
    h[3] += d;
    h[4] += e;
    h[5] += f;
    h[6] += g;
    h[7] += k;
}

static void sha256(const uint8_t *p, Py_ssize_t n, uint8_t out[32]) {
    uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                     0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    Py_ssize_t i = 0;
    for (; i + 64 <= n; i += 64) sha256_block(h, p + i);
    uint8_t last[128] = {0};
    Py_ssize_t rest = n - i;
    memcpy(last, p + i, (size_t)rest);
    last[rest] = 0x80;
    Py_ssize_t blocks = rest + 9 <= 64 ? 1 : 2;
    uint64_t bits = (uint64_t)n * 8;
    for (int j = 0; j < 8; j++) last[64 * blocks - 1 - j] = (uint8_t)(bits >> (8 * j));
    for (Py_ssize_t j = 0; j < blocks; j++) sha256_block(h, last + 64 * j);
    for (int j = 0; j < 8; j++) {
        out[4 * j] = (uint8_t)(h[j] >> 24);
        out[4 * j + 1] = (uint8_t)(h[j] >> 16);
        out[4 * j + 2] = (uint8_t)(h[j] >> 8);
        out[4 * j + 3] = (uint8_t)h[j];
    }
}

/* 1 when id is the lowercase hex SHA-256 of content (messages.message_id_of) */
static int id_of_content(const uint8_t *id, Py_ssize_t id_len, const uint8_t *content,
                         Py_ssize_t content_len) {
    static const char hex[] = "0123456789abcdef";
    uint8_t digest[32];
    if (id_len != 64) return 0;
    sha256(content, content_len, digest);
    for (int i = 0; i < 32; i++)
        if (id[2 * i] != hex[digest[i] >> 4] || id[2 * i + 1] != hex[digest[i] & 15]) return 0;
    return 1;
}

/* The bits set in [p, p + n): 64-bit words, each counted by halves, quarters and bytes */
static int64_t bits_set_words(const uint8_t *p, Py_ssize_t n) {
    int64_t total = 0;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t x;
        memcpy(&x, p + i, 8);
        x -= (x >> 1) & 0x5555555555555555ull;
        x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
        x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0full;
        total += (int64_t)((x * 0x0101010101010101ull) >> 56);
    }
    for (; i < n; i++)
        for (uint8_t b = p[i]; b; b &= (uint8_t)(b - 1)) total++;
    return total;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* The same with the CPU's popcnt instruction, where it has one (every x86-64 CPU since 2008;
 * the build does not assume it): a filter of 18,752 octets took ~3.5 us counted by words,
 * about a quarter of the decode of a record that carries one (measured). */
__attribute__((target("popcnt"))) static int64_t bits_set_popcnt(const uint8_t *p,
                                                                  Py_ssize_t n) {
    int64_t total = 0;
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t x;
        memcpy(&x, p + i, 8);
        total += __builtin_popcountll(x);
    }
    return total + bits_set_words(p + i, n - i);
}

static int64_t bits_set(const uint8_t *p, Py_ssize_t n) {
    static int has_popcnt = -1;
    if (has_popcnt < 0) {
        __builtin_cpu_init();
        has_popcnt = __builtin_cpu_supports("popcnt") != 0;
    }
    return has_popcnt ? bits_set_popcnt(p, n) : bits_set_words(p, n);
}
#else
#define bits_set bits_set_words
#endif

/* 1 when more than max bits are set in [p, p + n): counted 512 octets at a time, stopping as
 * soon as the rest cannot change the answer (a filter holding few ids is known to be under
 * the bound once the octets left have fewer bits than it lacks: about half of the default
 * filter read) */
static int over_full(const uint8_t *p, Py_ssize_t n, Py_ssize_t max) {
    int64_t total = 0;
    for (Py_ssize_t i = 0; i < n; i += 512) {
        if (total > max) return 1;
        if (total + 8 * (int64_t)(n - i) <= max) return 0;
        total += bits_set(p + i, n - i < 512 ? n - i : 512);
    }
    return total > max;
}

/* Walk record [p, e) (at position base in data) into row; entries / requests appended.
 * Returns 1 when vouched for, 0 when flagged (appended entries are then dropped by the
 * caller), -1 on memory error. */
static int walk(const uint8_t *data, const uint8_t *p, const uint8_t *e, const uint8_t *channel,
                Py_ssize_t channel_len, Py_ssize_t bloom_bytes, const Limits *lim, int64_t *row,
                Vec *ents, Vec *reqs, Py_ssize_t *n_hist, Py_ssize_t *n_req,
                const Vouched *vouched, int verify_ids, Py_ssize_t max_bloom_bits) {
    const uint8_t *at;
    Py_ssize_t n;
    const uint8_t *sender = NULL, *mid = NULL, *chan = NULL, *content = NULL;
    Py_ssize_t sender_len = 0, mid_len = 0, chan_len = 0;
    int seen_lamport = 0, seen_bloom = 0, seen_content = 0;
    uint64_t lamport = 0;
    Py_ssize_t bloom_len = 0, content_len = -1;
    const uint8_t *bloom = NULL;
    if (e - p > lim->max_message || p == e) return 0;
    while (p < e) {
        uint8_t tag = *p++;
        switch (tag) {
        case 0x0a:
        case 0x12:
        case 0x1a: {
            const uint8_t **slot = tag == 0x0a ? &sender : tag == 0x12 ? &mid : &chan;
            Py_ssize_t *slot_len = tag == 0x0a ? &sender_len : tag == 0x12 ? &mid_len : &chan_len;
            if (*slot || !body(&p, e, &at, &n) || n > lim->max_id || !ascii(at, n)) return 0;
            *slot = at;
            *slot_len = n;
            break;
        }
        case 0x50:
            if (seen_lamport || !varint(&p, e, &lamport)) return 0;
            seen_lamport = 1;
            break;
        case 0x5a:
            if (!*n_hist && !row[R_RUN]) { /* the first entry: a run of an earlier record's? */
                const uint8_t *next;
                Py_ssize_t k = earlier_run(vouched, data, sender, sender_len, p - 1, e, ents, &next,
                                           row);
                if (k < 0) return -1;
                if (k) {
                    if ((*n_hist += k) > lim->max_history) return 0;
                    row[R_RUN] = k;
                    p = next;
                    break;
                }
            }
            /* fall through */
        case 0x6a: {
            const uint8_t *id;
            Py_ssize_t id_len;
            if (!body(&p, e, &at, &n) || !entry(at, at + n, lim, &id, &id_len)) return 0;
            Vec *out = tag == 0x5a ? ents : reqs;
            if (tag == 0x5a ? ++*n_hist > lim->max_history : ++*n_req > lim->max_requests)
                return 0;
            if (vec_reserve(out, 4)) return -1;
            int64_t *w = out->v + out->n;
            if (tag == 0x5a) {
                w[0] = at - data;
                w[1] = n;
                w += 2;
            }
            w[0] = id - data;
            w[1] = id_len;
            out->n = w + 2 - out->v;
            break;
        }
        case 0x62:
            if (seen_bloom || !body(&p, e, &bloom, &bloom_len)) return 0;
            seen_bloom = 1;
            break;
        case 0xa2:
            if (seen_content || p >= e || *p++ != 0x01 || !body(&p, e, &content, &content_len))
                return 0;
            seen_content = 1;
            break;
        default:
            return 0;
        }
    }
    if (!sender_len || !mid_len) return 0;
    if (chan_len != channel_len || (chan_len && memcmp(chan, channel, (size_t)chan_len)))
        return 0;
    if (content_len > lim->max_content) return 0;
    if (!seen_lamport && content_len <= 0) return 0;
    if (seen_bloom && bloom_len != bloom_bytes) return 0;
    if (lamport >= ((uint64_t)1 << 63)) return 0;
    if (verify_ids && seen_lamport && content_len > 0 &&
        !id_of_content(mid, mid_len, content, content_len))
        return 0; /* the reference names it: bad-message-id */
    if (seen_bloom && max_bloom_bits >= 0 && over_full(bloom, bloom_len, max_bloom_bits))
        seen_bloom = 0; /* over-full: no evidence of receipt */
    row[R_SENDER_AT] = sender - data;
    row[R_SENDER_LEN] = sender_len;
    row[R_MID_AT] = mid - data;
    row[R_MID_LEN] = mid_len;
    row[R_LAMPORT] = (int64_t)lamport;
    row[R_HAS_LAMPORT] = seen_lamport;
    row[R_BLOOM_AT] = seen_bloom ? bloom - data : -1;
    row[R_CONTENT_LEN] = content_len;
    return 1;
}

static int int64_buffer(Py_buffer *b, const char *what) {
    if (b->itemsize != 8 || b->len % 8) {
        PyErr_Format(PyExc_ValueError, "%s: an int64 array expected", what);
        return -1;
    }
    return 0;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer offs, data, chan, rec;
    Py_ssize_t bloom_bytes, max_bloom_bits = -1;
    int verify_ids = 0;
    Limits lim;
    PyObject *result = NULL, *alloc = NULL;
    if (!PyArg_ParseTuple(args, "y*y*y*n(nnnnnn)w*|Opn", &offs, &data, &chan, &bloom_bytes,
                          &lim.max_message, &lim.max_id, &lim.max_hint, &lim.max_content,
                          &lim.max_history, &lim.max_requests, &rec, &alloc, &verify_ids,
                          &max_bloom_bits))
        return NULL;
    Vec ents = kept_ents, reqs = kept_reqs;
    kept_ents = kept_reqs = (Vec){0}; /* ours until done */
    ents.n = reqs.n = 0;
    if (int64_buffer(&offs, "offsets") || int64_buffer(&rec, "rec")) goto done;
    Py_ssize_t n = offs.len / 8 - 1;
    if (n < 0 || rec.len != n * R_FIELDS * 8) {
        PyErr_SetString(PyExc_ValueError, "rec must hold R_FIELDS int64 per record");
        goto done;
    }
    const int64_t *o = offs.buf;
    const uint8_t *d = data.buf;
    int64_t *rows = rec.buf;
    size_t size = 16;
    while (size < 2 * (size_t)n) size <<= 1;
    Vouched vouched = {malloc(size * sizeof(Seen)), size - 1, rows};
    if (!vouched.slot) {
        PyErr_NoMemory();
        goto done;
    }
    for (size_t i = 0; i < size; i++) vouched.slot[i].row = -1;
    for (Py_ssize_t r = 0; r < n; r++) {
        int64_t *row = rows + r * R_FIELDS;
        memset(row, 0, R_FIELDS * sizeof(int64_t));
        Py_ssize_t e0 = ents.n, q0 = reqs.n, n_hist = 0, n_req = 0;
        int v = 0;
        if (o[r] >= 0 && o[r] <= o[r + 1] && o[r + 1] <= data.len)
            v = walk(d, d + o[r], d + o[r + 1], chan.buf, chan.len, bloom_bytes, &lim, row, &ents,
                     &reqs, &n_hist, &n_req, &vouched, verify_ids, max_bloom_bits);
        if (v < 0) {
            free(vouched.slot);
            PyErr_NoMemory();
            goto done;
        }
        if (!v) {
            ents.n = e0;
            reqs.n = q0;
            memset(row, 0, R_FIELDS * sizeof(int64_t));
            row[R_FLAG] = 1;
        }
        row[R_HIST_END] = ents.n / 4;
        row[R_REQ_END] = reqs.n / 2;
        if (v) { /* this sender's last vouched record, for the next one's earlier_run */
            Seen *s = vouched_at(&vouched, d + row[R_SENDER_AT], row[R_SENDER_LEN]);
            *s = (Seen){d + row[R_SENDER_AT], row[R_SENDER_LEN], r};
        }
    }
    free(vouched.slot);
    {
        PyObject *a = vec_bytes(&ents, alloc), *b = a ? vec_bytes(&reqs, alloc) : NULL;
        if (a && b) result = PyTuple_Pack(2, a, b);
        Py_XDECREF(a);
        Py_XDECREF(b);
    }
done:
    vec_keep(&kept_ents, &ents);
    vec_keep(&kept_reqs, &reqs);
    PyBuffer_Release(&offs);
    PyBuffer_Release(&data);
    PyBuffer_Release(&chan);
    PyBuffer_Release(&rec);
    return result;
}

/* ---- positions over data, then extra --------------------------------------------------- */
typedef struct {
    const uint8_t *data, *extra;
    Py_ssize_t dlen, xlen;
} Space;

static const uint8_t *span(const Space *s, int64_t at, int64_t len) {
    if (at < 0 || len < 0) return NULL;
    if (at < s->dlen) return len <= s->dlen - at ? s->data + at : NULL;
    at -= s->dlen;
    return at <= s->xlen && len <= s->xlen - at ? s->extra + at : NULL;
}

/* id_hash's key, drawn once a process at import (getentropy): what the tables of this file
 * hash (history entries, senders, ids) is what a channel's members send; with a key they
 * cannot know, they cannot choose ids that share a slot and make each probe a walk of all of
 * them (a hash of a few words of each did let 40,000 chosen 64-character ids take 2 s in
 * list_codes, against 5 ms for as many random ones: found by review; causal's tables read
 * entries the same way). No output depends on it: the tables decide equality by the bytes,
 * and codes follow first appearance. */
static uint64_t hash_key;

static uint64_t id_hash(const uint8_t *p, Py_ssize_t n) {
    uint64_t h = (0x9E3779B97F4A7C15ULL ^ hash_key) ^ (uint64_t)n, w;
    while (n >= 8) {
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdULL;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    w = 0;
    memcpy(&w, p, (size_t)n);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 32);
}

/* One sender's previous message: its index and its entries' bodies */
typedef struct {
    int64_t index;
    Py_ssize_t k;
    const uint8_t **at;
    int64_t *len;
    uint64_t *hash;
} Prev;

/* Entries seen by a sender's previous message, as an open-addressing table of entry numbers */
typedef struct {
    int32_t *slot; /* entry number + 1; 0: empty */
    size_t mask;
} Table;

static int table_fill(Table *t, const Prev *p) {
    size_t size = 16;
    while (size < 2 * (size_t)p->k) size <<= 1;
    if (size - 1 > t->mask || !t->slot) {
        free(t->slot);
        t->slot = calloc(size, sizeof(int32_t));
        if (!t->slot) return -1;
        t->mask = size - 1;
    } else {
        memset(t->slot, 0, (t->mask + 1) * sizeof(int32_t));
    }
    for (Py_ssize_t i = 0; i < p->k; i++) {
        size_t h = (size_t)p->hash[i] & t->mask;
        while (t->slot[h]) h = (h + 1) & t->mask;
        t->slot[h] = (int32_t)(i + 1);
    }
    return 0;
}

static int table_has(const Table *t, const Prev *p, const uint8_t *at, int64_t len,
                     uint64_t hash) {
    size_t h = (size_t)hash & t->mask;
    while (t->slot[h]) {
        Py_ssize_t i = t->slot[h] - 1;
        if (p->hash[i] == hash && p->len[i] == len && !memcmp(p->at[i], at, (size_t)len))
            return 1;
        h = (h + 1) & t->mask;
    }
    return 0;
}

/* state's value for a sender: index:i64 k:i64 len[k]:i64 bodies */
static PyObject *prev_blob(int64_t index, const uint8_t **at, const int64_t *len, Py_ssize_t k) {
    Py_ssize_t total = 16 + 8 * k;
    for (Py_ssize_t i = 0; i < k; i++) total += len[i];
    PyObject *b = PyBytes_FromStringAndSize(NULL, total);
    if (!b) return NULL;
    char *w = PyBytes_AS_STRING(b);
    int64_t kk = k;
    memcpy(w, &index, 8);
    memcpy(w + 8, &kk, 8);
    memcpy(w + 16, len, 8 * (size_t)k);
    w += 16 + 8 * k;
    for (Py_ssize_t i = 0; i < k; i++) {
        memcpy(w, at[i], (size_t)len[i]);
        w += len[i];
    }
    return b;
}

/* A blob read back into prev (pointing into it): 0, or -1 if it is not one prev_blob made */
static int prev_read(PyObject *blob, Prev *p) {
    const uint8_t *b = (const uint8_t *)PyBytes_AS_STRING(blob);
    Py_ssize_t n = PyBytes_GET_SIZE(blob);
    int64_t k;
    if (n < 16) return -1;
    memcpy(&p->index, b, 8);
    memcpy(&k, b + 8, 8);
    if (k < 0 || k > (n - 16) / 8) return -1;
    p->k = (Py_ssize_t)k;
    p->at = malloc(sizeof(*p->at) * (size_t)(k + 1));
    p->len = malloc(sizeof(*p->len) * (size_t)(k + 1));
    p->hash = malloc(sizeof(*p->hash) * (size_t)(k + 1));
    if (!p->at || !p->len || !p->hash) return -2;
    const uint8_t *w = b + 16 + 8 * k, *e = b + n;
    for (Py_ssize_t i = 0; i < k; i++) {
        memcpy(&p->len[i], b + 16 + 8 * i, 8);
        if (p->len[i] < 0 || p->len[i] > e - w) return -1;
        p->at[i] = w;
        p->hash[i] = id_hash(w, p->len[i]);
        w += p->len[i];
    }
    return 0;
}

static void prev_free(Prev *p) {
    free(p->at);
    free(p->len);
    free(p->hash);
    memset(p, 0, sizeof(*p));
}

/* How many of a row's first entries (entries [j0, j1)) are, in order, entries of its sender's
 * previous message in this batch (entries [p0, p1)), laid out the same way in one run of bytes
 * equal to the previous message's (their out octets are then 0, as table_has finds): where a
 * sender's history is a window sliding over the channel, all but the new entries at its end.
 * Why: the entries are compared as one run of bytes (one memcmp of ~20 KB) instead of one hash
 * probe and one memcmp each. Exact: the two runs' bytes are equal and each entry sits at the
 * same offset in its run with the same length, so each is byte for byte an entry of the
 * previous message. The run starts where the previous message holds the row's first entry
 * (found by its bytes); anything else, or a run crossing from data into extra, gives 0 and the
 * caller compares entry by entry. *from: where the run starts among the previous message's
 * entries. */
static Py_ssize_t same_run(const Space *sp, const int64_t *ent, int64_t p0, int64_t p1,
                           int64_t j0, int64_t j1, int64_t *from) {
    if (j0 >= j1 || p0 >= p1) return 0;
    const int64_t *first = ent + 4 * j0;
    int64_t i0 = p0;
    for (; i0 < p1; i0++) {
        const int64_t *e = ent + 4 * i0;
        if (e[1] == first[1]) {
            const uint8_t *a = span(sp, e[0], e[1]), *b = span(sp, first[0], first[1]);
            if (a && b && !memcmp(a, b, (size_t)e[1])) break;
        }
    }
    if (i0 >= p1) return 0;
    int64_t n = 0, base_r = first[0], base_p = ent[4 * i0], next = 0;
    while (j0 + n < j1 && i0 + n < p1) {
        const int64_t *er = ent + 4 * (j0 + n), *ep = ent + 4 * (i0 + n);
        int64_t off = er[0] - base_r;
        /* in order and apart, as scan lays them out: then the run's bytes cover each */
        if (er[1] != ep[1] || off != ep[0] - base_p || off < next) break;
        next = off + er[1];
        n++;
    }
    if (n < 2) return 0; /* one entry: the table's way costs no more */
    const int64_t *last = ent + 4 * (j0 + n - 1);
    int64_t bytes = last[0] + last[1] - base_r;
    const uint8_t *a = span(sp, base_r, bytes), *b = span(sp, base_p, bytes);
    if (!a || !b || memcmp(a, b, (size_t)bytes)) return 0;
    *from = i0 - p0;
    return (Py_ssize_t)n;
}

/* causal's working arrays (each entry's place and hash, the batch's senders), kept from one
 * call to the next like scan's (kept_ents): as fresh mallocs (~10 MB a batch of 3,000 records
 * of 200-entry histories) glibc handed back pages it had trimmed or unmapped, and the writes
 * faulted them in again every batch: over half the page faults of a decode task, measured.
 * Let go of past KEEP_BYTES, as kept_ents. */
typedef struct {
    void *v;
    size_t cap;
} Scratch;
static Scratch kept_scratch;

static int scratch_reserve(Scratch *s, size_t need) {
    if (need <= s->cap) return 0;
    free(s->v);
    s->v = malloc(need);
    s->cap = s->v ? need : 0;
    return s->v ? 0 : -1;
}

static void scratch_keep(Scratch *s) {
    if (s->cap > (size_t)KEEP_BYTES) {
        free(s->v);
        *s = (Scratch){0};
    }
    if (kept_scratch.v) { /* a nested call kept one meanwhile: keep the larger */
        if (kept_scratch.cap >= s->cap) {
            free(s->v);
            return;
        }
        free(kept_scratch.v);
    }
    kept_scratch = *s;
}

/* This batch's senders: sender bytes -> the last row read, in order of first appearance */
typedef struct {
    const uint8_t *at;
    int64_t len;
    uint64_t hash;
    Py_ssize_t last;
} Sender;

static PyObject *causal(PyObject *self, PyObject *args) {
    PyObject *state, *result = NULL;
    Py_buffer data, extra, okb, senderb, indexb, endb, entb, runb, hintb = {0};
    if (!PyArg_ParseTuple(args, "O!y*y*y*y*y*y*y*w*|y*", &PyDict_Type, &state, &data, &extra,
                          &okb, &senderb, &indexb, &endb, &entb, &runb, &hintb))
        return NULL;
    Sender *senders = NULL;
    int64_t *tslot = NULL;
    const uint8_t **eat = NULL;
    uint64_t *ehash = NULL;
    Scratch scratch = kept_scratch;
    kept_scratch = (Scratch){0}; /* ours until done */
    Table table = {0};
    Prev carried = {0};
    size_t smask = 0;
    Py_ssize_t n_senders = 0;
    Space sp = {data.buf, extra.buf, data.len, extra.len};
    Py_ssize_t n = okb.len;
    if (int64_buffer(&senderb, "sender") || int64_buffer(&indexb, "index") ||
        int64_buffer(&endb, "hist_end") || int64_buffer(&entb, "entries"))
        goto done;
    if (senderb.len != 16 * n || indexb.len != 8 * n || endb.len != 8 * (n + 1) ||
        entb.len % 32 || runb.len != 12 * n || (hintb.obj && hintb.len != 24 * n)) {
        PyErr_SetString(PyExc_ValueError, "causal: arrays of unequal lengths");
        goto done;
    }
    int32_t *runs = runb.buf;
    memset(runs, 0, (size_t)runb.len);
    const uint8_t *ok = okb.buf;
    const int64_t *snd = senderb.buf, *idx = indexb.buf, *end = endb.buf, *ent = entb.buf;
    const int64_t *hint = hintb.obj ? hintb.buf : NULL;
    Py_ssize_t m = entb.len / 32;
    if (end[0] != 0 || end[n] != m) {
        PyErr_SetString(PyExc_ValueError, "causal: hist_end does not cover the entries");
        goto done;
    }
    for (Py_ssize_t r = 0; r < n; r++)
        if (end[r] > end[r + 1]) {
            PyErr_SetString(PyExc_ValueError, "causal: hist_end decreases");
            goto done;
        }
    result = PyBytes_FromStringAndSize(NULL, m);
    if (!result) goto done;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(result);
    memset(out, 1, (size_t)m);
    size_t ssize = 16;
    while (ssize < 2 * (size_t)n) ssize <<= 1;
    smask = ssize - 1;
    /* one block: eat, ehash, senders, tslot (every part a multiple of 8 octets) */
    size_t need = (sizeof(*eat) + sizeof(*ehash)) * (size_t)(m + 1) +
                  (sizeof(Sender) + sizeof(int64_t)) * ssize;
    if (scratch_reserve(&scratch, need)) {
        PyErr_NoMemory();
        goto fail;
    }
    eat = (const uint8_t **)scratch.v;
    ehash = (uint64_t *)(eat + (m + 1));
    senders = (Sender *)(ehash + (m + 1));
    tslot = (int64_t *)(senders + ssize);
    memset(senders, 0, sizeof(Sender) * ssize);
    for (size_t i = 0; i < ssize; i++) tslot[i] = -1;
    for (Py_ssize_t r = 0; r < n; r++) {
        /* the row's entries located, and hashed (below) right before they are compared: one
         * pass over a batch's ~60 MB of records for both, where a pass hashing every entry
         * first had the compare read them again from memory */
        for (int64_t j = end[r]; j < end[r + 1]; j++) {
            eat[j] = span(&sp, ent[4 * j], ent[4 * j + 1]);
            if (!eat[j]) {
                PyErr_SetString(PyExc_ValueError, "causal: an entry outside the buffers");
                goto fail;
            }
        }
        if (!ok[r]) continue; /* never a previous message: no hash needed */
        const uint8_t *s = span(&sp, snd[2 * r], snd[2 * r + 1]);
        if (!s) {
            PyErr_SetString(PyExc_ValueError, "causal: a sender outside the buffers");
            goto fail;
        }
        int64_t slen = snd[2 * r + 1];
        uint64_t h = id_hash(s, slen);
        size_t at = (size_t)h & smask;
        while (tslot[at] >= 0) {
            Sender *c = &senders[tslot[at]];
            if (c->hash == h && c->len == slen && !memcmp(c->at, s, (size_t)slen)) break;
            at = (at + 1) & smask;
        }
        Prev prev = {0}, *use = NULL;
        Py_ssize_t prow = -1; /* the previous message's row when it is in this batch */
        if (tslot[at] >= 0) {
            Sender *c = &senders[tslot[at]];
            Py_ssize_t p = c->last;
            if (idx[p] < idx[r]) {
                prow = p;
                prev.k = (Py_ssize_t)(end[p + 1] - end[p]);
                prev.at = eat + end[p];
                prev.hash = ehash + end[p];
                prev.len = NULL; /* read from ent below */
                use = &prev;
            }
            c->last = r;
            if (use) {
                /* the row's lengths are strided in ent: gather them for the compare */
                prev.len = malloc(sizeof(int64_t) * (size_t)(prev.k + 1));
                if (!prev.len) {
                    PyErr_NoMemory();
                    goto fail;
                }
                for (Py_ssize_t i = 0; i < prev.k; i++) prev.len[i] = ent[4 * (end[p] + i) + 1];
            }
        } else {
            tslot[at] = n_senders;
            senders[n_senders] = (Sender){s, slen, h, r};
            n_senders++;
            PyObject *key = PyBytes_FromStringAndSize((const char *)s, slen);
            if (!key) goto fail;
            PyObject *blob = PyDict_GetItemWithError(state, key);
            Py_DECREF(key);
            if (!blob && PyErr_Occurred()) goto fail;
            if (blob) {
                int bad = PyBytes_Check(blob) ? prev_read(blob, &carried) : -1;
                if (bad) {
                    prev_free(&carried);
                    if (bad == -2)
                        PyErr_NoMemory();
                    else
                        PyErr_SetString(PyExc_ValueError, "causal: a state value it did not make");
                    goto fail;
                }
                if (carried.index < idx[r]) use = &carried;
            }
        }
        int64_t j = end[r]; /* the row's entries from j on: compared through the table */
        if (use == &prev) {
            int64_t from = 0;
            Py_ssize_t run = 0;
            const int64_t *h = hint ? hint + 3 * r : NULL;
            if (h && h[2] >= 2 && h[0] == prow && h[1] >= 0 && h[1] + h[2] == prev.k &&
                h[2] <= end[r + 1] - j) {
                /* scan's run of this very row (earlier_run): what same_run would find */
                from = h[1];
                run = (Py_ssize_t)h[2];
            } else {
                run = same_run(&sp, ent, end[prow], end[prow + 1], j, end[r + 1], &from);
            }
            memset(out + j, 0, (size_t)run);
            /* a run's entries are its base's, byte for byte: so are their hashes (a sliding
             * window hashes each entry once, not once per message holding it) */
            memcpy(ehash + j, ehash + end[prow] + from, sizeof(*ehash) * (size_t)run);
            j += run;
            if (run && r - prow <= INT32_MAX && from <= INT32_MAX && run <= INT32_MAX) {
                runs[3 * r] = (int32_t)(r - prow);
                runs[3 * r + 1] = (int32_t)from;
                runs[3 * r + 2] = (int32_t)run;
            }
        }
        /* the other entries' hashes: for the table, and for the sender's next message */
        for (int64_t i = j; i < end[r + 1]; i++) ehash[i] = id_hash(eat[i], ent[4 * i + 1]);
        if (use) {
            if (j < end[r + 1] && table_fill(&table, use)) {
                if (use == &prev) free(prev.len);
                PyErr_NoMemory();
                goto fail;
            }
            for (; j < end[r + 1]; j++)
                out[j] = !table_has(&table, use, eat[j], ent[4 * j + 1], ehash[j]);
        }
        if (use == &prev) free(prev.len);
        prev_free(&carried);
    }
    /* each sender's last row becomes its previous message for the next batch */
    for (Py_ssize_t i = 0; i < n_senders; i++) {
        Sender *c = &senders[i];
        Py_ssize_t r = c->last, k = (Py_ssize_t)(end[r + 1] - end[r]);
        int64_t *lens = malloc(sizeof(int64_t) * (size_t)(k + 1));
        if (!lens) {
            PyErr_NoMemory();
            goto fail;
        }
        for (Py_ssize_t j = 0; j < k; j++) lens[j] = ent[4 * (end[r] + j) + 1];
        PyObject *blob = prev_blob(idx[r], eat + end[r], lens, k);
        free(lens);
        PyObject *key = blob ? PyBytes_FromStringAndSize((const char *)c->at, c->len) : NULL;
        /* bounded memory over a long task: the reference forgets every sender past 100,000 */
        if (key && PyDict_Size(state) > 100000) PyDict_Clear(state);
        int err = !key || PyDict_SetItem(state, key, blob);
        Py_XDECREF(key);
        Py_XDECREF(blob);
        if (err) goto fail;
    }
    goto done;
fail:
    Py_CLEAR(result);
done:
    scratch_keep(&scratch);
    free(table.slot);
    PyBuffer_Release(&data);
    PyBuffer_Release(&extra);
    PyBuffer_Release(&okb);
    PyBuffer_Release(&senderb);
    PyBuffer_Release(&indexb);
    PyBuffer_Release(&endb);
    PyBuffer_Release(&entb);
    PyBuffer_Release(&runb);
    if (hintb.obj) PyBuffer_Release(&hintb);
    return result;
}

static PyObject *gather(PyObject *self, PyObject *args) {
    Py_buffer data, extra, atb, lenb;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*y*y*y*", &data, &extra, &atb, &lenb)) return NULL;
    if (int64_buffer(&atb, "at") || int64_buffer(&lenb, "len")) goto done;
    if (atb.len != lenb.len) {
        PyErr_SetString(PyExc_ValueError, "gather: at and len of unequal lengths");
        goto done;
    }
    Space sp = {data.buf, extra.buf, data.len, extra.len};
    const int64_t *at = atb.buf, *len = lenb.buf;
    Py_ssize_t k = atb.len / 8, total = 0;
    for (Py_ssize_t i = 0; i < k; i++) {
        if (!span(&sp, at[i], len[i])) {
            PyErr_SetString(PyExc_ValueError, "gather: a span outside the buffers");
            goto done;
        }
        total += len[i];
    }
    result = PyBytes_FromStringAndSize(NULL, total);
    if (!result) goto done;
    char *w = PyBytes_AS_STRING(result);
    for (Py_ssize_t i = 0; i < k; i++) {
        memcpy(w, span(&sp, at[i], len[i]), (size_t)len[i]);
        w += len[i];
    }
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&extra);
    PyBuffer_Release(&atb);
    PyBuffer_Release(&lenb);
    return result;
}

/* The next j in [j, stop) whose octet in keep is not 0 (stop if none), 8 octets at a time
 * over runs of 0s: kept entries come in runs (a row's last ids), so a row of 200 entries of
 * which 20 are kept is a few loads, not 200 tests. */
static inline int64_t next_kept(const uint8_t *keep, int64_t j, int64_t stop) {
    while (j < stop && (j & 7)) {
        if (keep[j]) return j;
        j++;
    }
    while (j + 8 <= stop) {
        uint64_t w;
        memcpy(&w, keep + j, 8);
        if (w) break;
        j += 8;
    }
    while (j < stop && !keep[j]) j++;
    return j;
}

/* The arguments lists and list_codes share (data, extra, spans, width, ends, ok, keep[, alloc[,
 * skip]]), parsed and checked: every kept span inside the buffers, ends in order; k and total:
 * the kept entries and their bytes. */
typedef struct {
    Py_buffer data, extra, spanb, endb, okb, keepb, skipb;
    int held; /* the buffers above are held (released by lists_release) */
    Space sp;
    Py_ssize_t width, n, k, total;
    const int64_t *spans, *end;
    const uint8_t *ok, *keep;
    const int32_t *skip;
} ListsArgs;

static void lists_release(ListsArgs *a) {
    if (!a->held) return;
    PyBuffer_Release(&a->data);
    PyBuffer_Release(&a->extra);
    PyBuffer_Release(&a->spanb);
    PyBuffer_Release(&a->endb);
    PyBuffer_Release(&a->okb);
    PyBuffer_Release(&a->keepb);
    if (a->skipb.buf) PyBuffer_Release(&a->skipb);
    a->held = 0;
}

/* Row r's entries taken (from end[r] + skip[r] on, those keep marks): the span (at, len) of
 * the next one from *j on, *j moved to it; NULL past the row's last. A row's loop:
 *   for (int64_t j = first_taken(a, r); (s = next_taken(a, r, &j)); j++) */
static inline int64_t first_taken(const ListsArgs *a, Py_ssize_t r) {
    return a->end[r] + (a->skip ? a->skip[r] : 0);
}

static inline const int64_t *next_taken(const ListsArgs *a, Py_ssize_t r, int64_t *j) {
    int64_t stop = a->end[r + 1];
    if (*j < stop && a->keep) *j = next_kept(a->keep, *j, stop);
    return *j < stop ? a->spans + *j * a->width + a->width - 2 : NULL;
}

static int lists_args(const char *fn, PyObject *args, ListsArgs *a, PyObject **alloc) {
    if (!PyArg_ParseTuple(args, "y*y*y*ny*y*y*|Oy*", &a->data, &a->extra, &a->spanb, &a->width,
                          &a->endb, &a->okb, &a->keepb, alloc, &a->skipb))
        return -1; /* nothing held */
    if (*alloc == Py_None) *alloc = NULL;
    Py_ssize_t n = a->okb.len, m;
    a->held = 1;
    a->sp = (Space){a->data.buf, a->extra.buf, a->data.len, a->extra.len};
    a->n = n;
    if (int64_buffer(&a->spanb, "spans") || int64_buffer(&a->endb, "ends")) return -1;
    if (a->width < 2 || a->width > PY_SSIZE_T_MAX / 8 || a->spanb.len % (8 * a->width) ||
        a->endb.len != 8 * (n + 1)) {
        PyErr_Format(PyExc_ValueError, "%s: arrays of unequal lengths", fn);
        return -1;
    }
    m = a->spanb.len / (8 * a->width);
    if (a->keepb.len && a->keepb.len != m) {
        PyErr_Format(PyExc_ValueError, "%s: keep of another length", fn);
        return -1;
    }
    if (a->skipb.buf && a->skipb.len && a->skipb.len != 4 * n) {
        PyErr_Format(PyExc_ValueError, "%s: skip of another length", fn);
        return -1;
    }
    a->spans = a->spanb.buf;
    a->end = a->endb.buf;
    a->ok = a->okb.buf;
    a->keep = a->keepb.len ? a->keepb.buf : NULL;
    a->skip = a->skipb.buf && a->skipb.len ? a->skipb.buf : NULL;
    const int64_t *end = a->end;
    const int32_t *skip = a->skip;
    if (end[0] < 0 || end[n] > m) goto bad;
    for (Py_ssize_t r = 0; r < n; r++)
        if (end[r] > end[r + 1] || (skip && (skip[r] < 0 || skip[r] > end[r + 1] - end[r])))
            goto bad;
    /* every kept span checked, counted and sized */
    a->k = a->total = 0;
    for (Py_ssize_t r = 0; r < n; r++) {
        if (!a->ok[r]) continue;
        const int64_t *s;
        for (int64_t j = first_taken(a, r); (s = next_taken(a, r, &j)); j++) {
            if (!span(&a->sp, s[0], s[1])) goto bad;
            a->k++;
            a->total += s[1];
        }
    }
    if (a->total > INT32_MAX || a->k > INT32_MAX) {
        PyErr_Format(PyExc_OverflowError, "%s: a batch's ids over 2 GiB", fn);
        return -1;
    }
    return 0;
bad:
    PyErr_Format(PyExc_ValueError, "%s: a span outside the buffers or ends out of order", fn);
    return -1;
}

/* The ids at spans (rows of width int64, the id's (at, len) its last two) as Arrow list<string>
 * buffers: rows r with ok[r] take their spans from ends[r] + skip[r] to ends[r + 1] (skip
 * empty: from ends[r]), those whose octet in keep is 1 (keep empty: all). Returns (values,
 * value offsets i32, list offsets i32, lengths i32). skip (int32 a row: the row's run, its
 * first entries that history_stored leaves out) costs nothing per skipped entry, where a keep
 * octet per entry was an array to build and to test (decode task, 1M messages). */
static PyObject *lists(PyObject *self, PyObject *args) {
    ListsArgs a = {0};
    PyObject *result = NULL, *alloc = NULL;
    Out values = {0}, voffs = {0}, loffs = {0}, lens = {0};
    if (lists_args("lists", args, &a, &alloc)) goto done;
    if (out_new(&values, alloc, a.total) || out_new(&voffs, alloc, 4 * (a.k + 1)) ||
        out_new(&loffs, alloc, 4 * (a.n + 1)) || out_new(&lens, alloc, 4 * a.k))
        goto done;
    {
        char *w = values.w;
        int32_t *vo = (int32_t *)voffs.w, *lo = (int32_t *)loffs.w, *ln = (int32_t *)lens.w;
        int32_t at = 0, i = 0;
        vo[0] = 0;
        lo[0] = 0;
        for (Py_ssize_t r = 0; r < a.n; r++) {
            const int64_t *s;
            if (a.ok[r])
                for (int64_t j = first_taken(&a, r); (s = next_taken(&a, r, &j)); j++) {
                    memcpy(w + at, span(&a.sp, s[0], s[1]), (size_t)s[1]);
                    at += (int32_t)s[1];
                    ln[i] = (int32_t)s[1];
                    vo[++i] = at;
                }
            lo[r + 1] = i;
        }
    }
    result = PyTuple_Pack(4, values.obj, voffs.obj, loffs.obj, lens.obj);
done:
    Py_XDECREF(out_release(&values));
    Py_XDECREF(out_release(&voffs));
    Py_XDECREF(out_release(&loffs));
    Py_XDECREF(out_release(&lens));
    lists_release(&a);
    return result;
}

/* list_codes(data, extra, spans, width, ends, ok, keep[, alloc[, skip]]) -> (values, value
 * offsets i32, codes i32, list offsets i32, distinct, bytes): the ids lists takes, as codes
 * into the distinct ids, in order of first appearance: values and value offsets hold the first
 * `distinct` of them (`bytes` octets; the buffers are sized for all the ids), codes one per
 * entry taken. Why: a content message's id is in causal_new of about one message per
 * sender, and in the stored history (past the run) of about one message per sender too, so a
 * batch's ids are ~20 copies each; copied out as strings, each was hashed again in Python
 * (the job's codes, Parquet's dictionary) and compressed into the job's work file. Equal ids
 * are found by their bytes (id_hash, keyed, picks the slot; memcmp decides). */
static PyObject *list_codes(PyObject *self, PyObject *args) {
    ListsArgs a = {0};
    PyObject *result = NULL, *alloc = NULL;
    Out values = {0}, voffs = {0}, codes = {0}, loffs = {0};
    int32_t *slots = NULL;
    if (lists_args("list_codes", args, &a, &alloc)) goto done;
    if (out_new(&values, alloc, a.total) || out_new(&voffs, alloc, 4 * (a.k + 1)) ||
        out_new(&codes, alloc, 4 * a.k) || out_new(&loffs, alloc, 4 * (a.n + 1)))
        goto done;
    size_t m = 16;
    while (m < 2 * (size_t)a.k) m <<= 1;
    slots = malloc(m * sizeof(int32_t));
    if (!slots) {
        PyErr_NoMemory();
        goto done;
    }
    memset(slots, 0xff, m * sizeof(int32_t)); /* -1: empty */
    char *w = values.w;
    int32_t *vo = (int32_t *)voffs.w, *co = (int32_t *)codes.w, *lo = (int32_t *)loffs.w;
    int32_t at = 0, i = 0, distinct = 0;
    vo[0] = 0;
    lo[0] = 0;
    for (Py_ssize_t r = 0; r < a.n; r++) {
        const int64_t *s;
        if (a.ok[r])
            for (int64_t j = first_taken(&a, r); (s = next_taken(&a, r, &j)); j++) {
                const uint8_t *id = span(&a.sp, s[0], s[1]);
                int32_t len = (int32_t)s[1], c;
                size_t h = (size_t)id_hash(id, len) & (m - 1);
                while ((c = slots[h]) >= 0 &&
                       (vo[c + 1] - vo[c] != len || memcmp(w + vo[c], id, (size_t)len)))
                    h = (h + 1) & (m - 1);
                if (c < 0) { /* the first of this id */
                    c = slots[h] = distinct++;
                    memcpy(w + at, id, (size_t)len);
                    at += len;
                    vo[distinct] = at;
                }
                co[i++] = c;
            }
        lo[r + 1] = i;
    }
    result = Py_BuildValue("(OOOOnn)", values.obj, voffs.obj, codes.obj, loffs.obj,
                           (Py_ssize_t)distinct, (Py_ssize_t)at);
done:
    free(slots);
    Py_XDECREF(out_release(&values));
    Py_XDECREF(out_release(&voffs));
    Py_XDECREF(out_release(&codes));
    Py_XDECREF(out_release(&loffs));
    lists_release(&a);
    return result;
}

/* ---- unpack: causal histories from the decoder's runs ----
 *
 * The decoded rows keep of a history only what its run (causal's runs) does not cover: a row
 * whose history starts with `run` entries of the history `back` rows before it, from its
 * entry `from`, stores the entries after them. unpack rebuilds every row's whole history in
 * row order (a row's base comes before it, rebuilt already) as Arrow list<string> buffers.
 * Why: a history mostly repeats its sender's previous one, and storing it whole made the
 * decode copy and compress ~13 KB a record that the messages table's writer reads once.
 *
 *   unpack(offs, data, loffs, valid, back, from, run[, alloc]) -> (values, value offsets i32,
 *     list offsets i32)
 * offs (i32, k + 1) and data: the stored ids, as a string array's buffers; loffs (i32, n + 1):
 * each row's stored ids among them; valid (u8, n); back, from, run (i32, n). A null row has
 * no run and no ids; a base must be a valid row before its row, and its entries
 * [from, from + run) must exist: anything else raises ValueError. */
static int i32_buffer(Py_buffer *b, Py_ssize_t n, const char *fn, const char *what) {
    if (b->len != 4 * n) {
        PyErr_Format(PyExc_ValueError, "%s: %s of another length", fn, what);
        return -1;
    }
    return 0;
}

/* The history columns of unpack and unpack_codes checked (loffs: n + 1 int32 list offsets
 * into k stored ids; back, from, run: n int32 each; n = valid's length) and every row's
 * history length (*count, n + 1 slots, the caller's to free): a run's base is an earlier
 * valid row with as many entries; a row that is not valid has none. The total, or -1 with
 * an exception set. */
static int64_t run_counts(const char *fn, Py_buffer *loffb, Py_buffer *validb,
                          Py_buffer *backb, Py_buffer *fromb, Py_buffer *runb, Py_ssize_t k,
                          int64_t **count_out) {
    Py_ssize_t n = validb->len;
    if (i32_buffer(loffb, n + 1, fn, "list offsets") || i32_buffer(backb, n, fn, "back") ||
        i32_buffer(fromb, n, fn, "from") || i32_buffer(runb, n, fn, "run"))
        return -1;
    const int32_t *lo = loffb->buf, *back = backb->buf, *from = fromb->buf, *run = runb->buf;
    const uint8_t *valid = validb->buf;
    int64_t *count = *count_out = malloc(sizeof(int64_t) * (size_t)(n + 1));
    if (!count) {
        PyErr_NoMemory();
        return -1;
    }
    int64_t total = 0;
    if (lo[0] < 0 || lo[n] > k) goto bad;
    for (Py_ssize_t r = 0; r < n; r++) {
        if (lo[r] > lo[r + 1] || back[r] < 0 || from[r] < 0 || run[r] < 0) goto bad;
        count[r] = lo[r + 1] - lo[r];
        if (run[r]) {
            Py_ssize_t p = r - back[r];
            if (!back[r] || !valid[r] || p < 0 || !valid[p] ||
                (int64_t)from[r] + run[r] > count[p])
                goto bad;
            count[r] += run[r];
        } else if (back[r] || from[r]) {
            goto bad;
        }
        if (!valid[r] && count[r]) goto bad;
        total += count[r];
    }
    if (total > INT32_MAX) {
        PyErr_Format(PyExc_OverflowError, "%s: a batch's history entries over 2^31 - 1", fn);
        return -1;
    }
    return total;
bad:
    PyErr_Format(PyExc_ValueError,
                 "%s: offsets out of order, or a run without a valid earlier base", fn);
    return -1;
}

static PyObject *unpack(PyObject *self, PyObject *args) {
    Py_buffer offb, data, loffb, validb, backb, fromb, runb;
    PyObject *result = NULL, *alloc = NULL;
    Out values = {0}, voffs = {0}, loffs = {0};
    int64_t *count = NULL;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*y*|O", &offb, &data, &loffb, &validb, &backb,
                          &fromb, &runb, &alloc))
        return NULL;
    Py_ssize_t n = validb.len, k = offb.len / 4 - 1;
    if (offb.len % 4 || k < 0) {
        PyErr_SetString(PyExc_ValueError, "unpack: offsets not int32s");
        goto done;
    }
    const int32_t *off = offb.buf;
    if (off[0] < 0 || off[k] > data.len) goto bad;
    for (Py_ssize_t i = 0; i < k; i++)
        if (off[i] > off[i + 1]) goto bad;
    /* first pass: every row checked and its count; a base's count is known before its row */
    int64_t total = run_counts("unpack", &loffb, &validb, &backb, &fromb, &runb, k, &count);
    if (total < 0) goto done;
    const int32_t *lo = loffb.buf, *back = backb.buf, *from = fromb.buf, *run = runb.buf;
    if (out_new(&voffs, alloc, 4 * (total + 1)) || out_new(&loffs, alloc, 4 * (n + 1)))
        goto done;
    /* second pass: list and value offsets (a run's lengths are its base's) */
    int32_t *vo = (int32_t *)voffs.w, *lw = (int32_t *)loffs.w;
    int64_t at = 0, i = 0;
    vo[0] = 0;
    lw[0] = 0;
    for (Py_ssize_t r = 0; r < n; r++) {
        if (run[r]) {
            const int32_t *b = vo + lw[r - back[r]] + from[r];
            for (int32_t j = 0; j < run[r]; j++) {
                at += b[j + 1] - b[j];
                if (at > INT32_MAX) goto too_big;
                vo[++i] = (int32_t)at;
            }
        }
        for (int32_t j = lo[r]; j < lo[r + 1]; j++) {
            at += off[j + 1] - off[j];
            if (at > INT32_MAX) goto too_big;
            vo[++i] = (int32_t)at;
        }
        lw[r + 1] = (int32_t)i;
    }
    if (out_new(&values, alloc, at)) goto done;
    /* third pass: the bytes, a run in one copy from its base's (earlier in values) */
    {
        char *w = values.w;
        const char *d = data.buf;
        for (Py_ssize_t r = 0; r < n; r++) {
            char *o = w + vo[lw[r]];
            if (run[r]) {
                const int32_t *b = vo + lw[r - back[r]] + from[r];
                size_t len = (size_t)(b[run[r]] - b[0]);
                memcpy(o, w + b[0], len);
                o += len;
            }
            size_t len = (size_t)(off[lo[r + 1]] - off[lo[r]]);
            memcpy(o, d + off[lo[r]], len);
        }
    }
    result = PyTuple_Pack(3, values.obj, voffs.obj, loffs.obj);
    goto done;
too_big:
    PyErr_SetString(PyExc_OverflowError, "unpack: a batch's ids over 2 GiB");
    goto done;
bad:
    PyErr_SetString(PyExc_ValueError,
                    "unpack: offsets out of order, or a run without a valid earlier base");
done:
    free(count);
    Py_XDECREF(out_release(&values));
    Py_XDECREF(out_release(&voffs));
    Py_XDECREF(out_release(&loffs));
    PyBuffer_Release(&offb);
    PyBuffer_Release(&data);
    PyBuffer_Release(&loffb);
    PyBuffer_Release(&validb);
    PyBuffer_Release(&backb);
    PyBuffer_Release(&fromb);
    PyBuffer_Release(&runb);
    return result;
}

/* unpack_codes: unpack's histories as an int32 code an entry, from one code a stored id
 * (codes: k of them, each in [0, n_codes)): a run is a copy of its base's codes. The caller
 * gives each distinct stored id one code, in order of first appearance among the stored ids
 * (dictionary_encode); a history's run only repeats entries of earlier rows, so that is also
 * their order of first appearance in the histories read row by row: the dictionary Parquet's
 * writer would have built by hashing every entry (200 a row) is had from the ~20 stored ids a
 * row, and the ids are never copied out. */
static PyObject *unpack_codes(PyObject *self, PyObject *args) {
    Py_buffer loffb, validb, backb, fromb, runb, codeb;
    PyObject *result = NULL, *alloc = NULL;
    Out codes = {0}, loffs = {0};
    int64_t *count = NULL;
    Py_ssize_t n_codes;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*y*n|O", &loffb, &validb, &backb, &fromb, &runb,
                          &codeb, &n_codes, &alloc))
        return NULL;
    Py_ssize_t n = validb.len, k = codeb.len / 4;
    if (codeb.len % 4) {
        PyErr_SetString(PyExc_ValueError, "unpack_codes: codes not int32s");
        goto done;
    }
    const int32_t *code = codeb.buf;
    for (Py_ssize_t i = 0; i < k; i++)
        if (code[i] < 0 || code[i] >= n_codes) {
            PyErr_SetString(PyExc_ValueError, "unpack_codes: a code out of range");
            goto done;
        }
    int64_t total =
        run_counts("unpack_codes", &loffb, &validb, &backb, &fromb, &runb, k, &count);
    if (total < 0) goto done;
    const int32_t *lo = loffb.buf, *back = backb.buf, *from = fromb.buf, *run = runb.buf;
    if (out_new(&codes, alloc, 4 * total) || out_new(&loffs, alloc, 4 * (n + 1))) goto done;
    int32_t *cw = (int32_t *)codes.w, *lw = (int32_t *)loffs.w;
    int64_t at = 0;
    lw[0] = 0;
    for (Py_ssize_t r = 0; r < n; r++) {
        if (run[r]) {
            memcpy(cw + at, cw + lw[r - back[r]] + from[r], sizeof(int32_t) * (size_t)run[r]);
            at += run[r];
        }
        Py_ssize_t own = lo[r + 1] - lo[r];
        memcpy(cw + at, code + lo[r], sizeof(int32_t) * (size_t)own);
        at += own;
        lw[r + 1] = (int32_t)at;
    }
    result = PyTuple_Pack(2, codes.obj, loffs.obj);
done:
    free(count);
    Py_XDECREF(out_release(&codes));
    Py_XDECREF(out_release(&loffs));
    PyBuffer_Release(&loffb);
    PyBuffer_Release(&validb);
    PyBuffer_Release(&backb);
    PyBuffer_Release(&fromb);
    PyBuffer_Release(&runb);
    PyBuffer_Release(&codeb);
    return result;
}

/* ---- id_table / id_lookup: where each of a list column's ids lies among a set of ids ----
 *
 * What pyarrow.compute.index_in gives (the first position of the value in the set, -1 for
 * none), with the set's hash table built once and kept by the caller (slots), not once a call:
 * the sds-audit sweep looks up each decoded file's kept causal_new ids against the ~1M content
 * ids, straight from the file's column (index_in needed them taken out first, a copy of every
 * kept id). Ids are compared by their bytes; the caller passes no null value (ids are never
 * null in the decoded columns; the Python side falls back to index_in when one is). */

/* offsets of n strings (int32, n + 1 of them) checked against data's length */
static int offsets_ok(const int32_t *o, Py_ssize_t n, Py_ssize_t data_len) {
    if (n < 0 || o[0] < 0 || o[n] > data_len) return 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (o[i] > o[i + 1]) return 0;
    return 1;
}

/* The slot where a probe for the id (p, len) ends among slots (m of them) over the ids (to,
 * td): the slot holding an equal id, or the first empty one (-1) */
static size_t id_probe(const int32_t *slots, Py_ssize_t m, const int32_t *to, const uint8_t *td,
                       const uint8_t *p, Py_ssize_t len) {
    size_t s = (size_t)(id_hash(p, len) & (uint64_t)(m - 1));
    for (int32_t c; (c = slots[s]) >= 0; s = (s + 1) & (size_t)(m - 1))
        if (to[c + 1] - to[c] == len && !memcmp(td + to[c], p, (size_t)len)) break;
    return s;
}

/* id_table(offsets, data, slots): the set's ids (string offsets int32, data) hashed into slots
 * (int32, m of them, a power of two over n; -1 empty), the first of repeated ids kept */
static PyObject *id_table(PyObject *self, PyObject *args) {
    Py_buffer ob, db, sb;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*y*w*", &ob, &db, &sb)) return NULL;
    Py_ssize_t n = ob.len / 4 - 1, m = sb.len / 4;
    const int32_t *o = ob.buf;
    int32_t *slots = sb.buf;
    const uint8_t *d = db.buf;
    if (ob.len % 4 || sb.len % 4 || n < 0 || n >= INT32_MAX || m <= n || (m & (m - 1)) ||
        !offsets_ok(o, n, db.len)) {
        PyErr_SetString(PyExc_ValueError, "id_table: bad offsets or slots");
        goto done;
    }
    for (Py_ssize_t i = 0; i < m; i++) slots[i] = -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        size_t s = id_probe(slots, m, o, d, d + o[i], o[i + 1] - o[i]);
        if (slots[s] < 0) slots[s] = (int32_t)i; /* else an earlier equal id stays */
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&ob);
    PyBuffer_Release(&db);
    PyBuffer_Release(&sb);
    return result;
}

/* id_hashes(offsets, data, out): each of the n strings' id_hash (out: uint64, n of them),
 * without the GIL. Why: the driver of sds-audit finds each message id's first copy among ~1M
 * ids by sorting their hashes (equal ids have equal hashes; the few rows whose hash is
 * another's are compared as strings), where one hash table of the ids held every id
 * combined into one array first. */
static PyObject *id_hashes(PyObject *self, PyObject *args) {
    Py_buffer ob, db, hb;
    PyObject *result = NULL;
    if (!PyArg_ParseTuple(args, "y*y*w*", &ob, &db, &hb)) return NULL;
    Py_ssize_t n = ob.len / 4 - 1;
    const int32_t *o = ob.buf;
    const uint8_t *d = db.buf;
    uint8_t *out = hb.buf;
    if (ob.len % 4 || n < 0 || hb.len != 8 * n || !offsets_ok(o, n, db.len)) {
        PyErr_SetString(PyExc_ValueError, "id_hashes: bad offsets, or out of another length");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) { /* out may be any buffer: no aligned store */
        uint64_t h = id_hash(d + o[i], o[i + 1] - o[i]);
        memcpy(out + 8 * i, &h, sizeof h);
    }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&ob);
    PyBuffer_Release(&db);
    PyBuffer_Release(&hb);
    return result;
}

/* One part of an id_lookup: a string array's offsets and data, and the ranges of its values
 * to look up */
typedef struct {
    Py_buffer b[4]; /* offsets, data, starts, ends */
    int held;       /* how many of b are held (released on the way out) */
} Part;

/* A part taken from its (offsets, data, starts, ends) tuple and checked: offsets within the
 * data, ranges within the values. Returns the values it covers, or -1 (error set). */
static Py_ssize_t part_take(PyObject *item, Part *pt) {
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 4) {
        PyErr_SetString(PyExc_ValueError, "id_lookup: a part is not (offsets, data, starts, ends)");
        return -1;
    }
    for (int i = 0; i < 4; i++) {
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(item, i), &pt->b[i], PyBUF_SIMPLE) < 0) return -1;
        pt->held = i + 1;
    }
    if (int64_buffer(&pt->b[2], "starts") || int64_buffer(&pt->b[3], "ends")) return -1;
    Py_ssize_t nv = pt->b[0].len / 4 - 1, k = pt->b[2].len / 8, total = 0;
    const int64_t *st = pt->b[2].buf, *en = pt->b[3].buf;
    if (pt->b[0].len % 4 || pt->b[3].len != pt->b[2].len ||
        !offsets_ok(pt->b[0].buf, nv, pt->b[1].len)) {
        PyErr_SetString(PyExc_ValueError, "id_lookup: bad offsets or ranges");
        return -1;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        if (st[i] < 0 || st[i] > en[i] || en[i] > nv) {
            PyErr_SetString(PyExc_ValueError, "id_lookup: a range outside the values");
            return -1;
        }
        total += en[i] - st[i];
    }
    return total;
}

/* id_lookup(slots, t_offsets, t_data, parts, out): for each (offsets, data, starts, ends) of
 * parts in turn, the values starts[i] to ends[i] of (offsets, data), for each i in turn, each's
 * position among the table's ids or -1, written one after another into out (int64, as many as
 * the ranges hold). Why every part in one call: the table (~1M ids, ~2M slots) is checked once
 * per call, and the sweep has a part per record batch of each file it reads. */
static PyObject *id_lookup(PyObject *self, PyObject *args) {
    Py_buffer sb, tob, tdb, outb;
    PyObject *parts_obj, *seq = NULL, *result = NULL;
    Part *parts = NULL;
    Py_ssize_t np_ = 0;
    if (!PyArg_ParseTuple(args, "y*y*y*Ow*", &sb, &tob, &tdb, &parts_obj, &outb)) return NULL;
    Py_ssize_t m = sb.len / 4, n = tob.len / 4 - 1;
    const int32_t *slots = sb.buf, *to = tob.buf;
    int64_t *out = outb.buf;
    if (int64_buffer(&outb, "out")) goto done;
    if (sb.len % 4 || tob.len % 4 || m < 1 || (m & (m - 1)) || n < 0 || m <= n ||
        !offsets_ok(to, n, tdb.len)) {
        PyErr_SetString(PyExc_ValueError, "id_lookup: bad table, offsets or ranges");
        goto done;
    }
    Py_ssize_t empty = 0; /* a probe for a missing id ends at an empty slot: one at least */
    for (Py_ssize_t i = 0; i < m; i++) {
        if (slots[i] < -1 || slots[i] >= n) {
            PyErr_SetString(PyExc_ValueError, "id_lookup: slots not of this table");
            goto done;
        }
        empty += slots[i] == -1;
    }
    if (!empty) {
        PyErr_SetString(PyExc_ValueError, "id_lookup: slots not of this table (none empty)");
        goto done;
    }
    seq = PySequence_Fast(parts_obj, "id_lookup: parts must be a sequence");
    if (!seq) goto done;
    np_ = PySequence_Fast_GET_SIZE(seq);
    parts = calloc(np_ ? (size_t)np_ : 1, sizeof(Part));
    if (!parts) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t total = 0;
    for (Py_ssize_t p = 0; p < np_; p++) {
        Py_ssize_t t = part_take(PySequence_Fast_GET_ITEM(seq, p), &parts[p]);
        if (t < 0) goto done;
        total += t;
    }
    if (total * 8 != outb.len) {
        PyErr_SetString(PyExc_ValueError, "id_lookup: out of another length");
        goto done;
    }
    const uint8_t *td = tdb.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t p = 0; p < np_; p++) {
        const int32_t *o = parts[p].b[0].buf;
        const uint8_t *d = parts[p].b[1].buf;
        const int64_t *st = parts[p].b[2].buf, *en = parts[p].b[3].buf;
        Py_ssize_t k = parts[p].b[2].len / 8;
        for (Py_ssize_t i = 0; i < k; i++)
            for (int64_t j = st[i]; j < en[i]; j++)
                *out++ = slots[id_probe(slots, m, to, td, d + o[j], o[j + 1] - o[j])];
    }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    for (Py_ssize_t p = 0; parts && p < np_; p++)
        for (int i = 0; i < parts[p].held; i++) PyBuffer_Release(&parts[p].b[i]);
    free(parts);
    Py_XDECREF(seq);
    PyBuffer_Release(&sb);
    PyBuffer_Release(&tob);
    PyBuffer_Release(&tdb);
    PyBuffer_Release(&outb);
    return result;
}

static PyMethodDef methods[] = {
    {"lists", lists, METH_VARARGS,
     "lists(data, extra, spans, width, ends, ok, keep[, alloc[, skip]]) -> (values, offsets, "
     "list offsets, lens)"},
    {"list_codes", list_codes, METH_VARARGS,
     "list_codes(data, extra, spans, width, ends, ok, keep[, alloc[, skip]]) -> (values, offsets, "
     "codes, list offsets, distinct, bytes)"},
    {"scan", scan, METH_VARARGS,
     "scan(offsets, data, channel, bloom_bytes, limits, rec[, alloc[, verify_ids[, "
     "max_bloom_bits]]]) -> (entries, requests)"},
    {"causal", causal, METH_VARARGS,
     "causal(state, data, extra, ok, sender, index, hist_end, entries, runs[, hints]) -> new"},
    {"gather", gather, METH_VARARGS, "gather(data, extra, at, len) -> bytes"},
    {"unpack", unpack, METH_VARARGS,
     "unpack(offs, data, loffs, valid, back, from, run[, alloc]) -> history list buffers"},
    {"unpack_codes", unpack_codes, METH_VARARGS,
     "unpack_codes(loffs, valid, back, from, run, codes, n_codes[, alloc]) -> (entry codes, "
     "list offsets)"},
    {"id_table", id_table, METH_VARARGS, "id_table(offsets, data, slots) -> None"},
    {"id_hashes", id_hashes, METH_VARARGS, "id_hashes(offsets, data, out) -> None"},
    {"id_lookup", id_lookup, METH_VARARGS,
     "id_lookup(slots, t_offsets, t_data, parts, out) -> None (parts: (offsets, data, starts, "
     "ends) each)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_decode",
                                    "The sds-audit decoder's batch kernel (see the C source).",
                                    -1, methods};

PyMODINIT_FUNC PyInit__decode(void) {
    if (getentropy(&hash_key, sizeof(hash_key)) != 0) /* no entropy source: the next best */
        hash_key = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ULL ^ (uint64_t)(uintptr_t)&hash_key;
    PyObject *m = PyModule_Create(&module);
    if (m && PyModule_AddIntConstant(m, "R_FIELDS", R_FIELDS)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
