/* workbench_tap.h -- write workbench engine dumps and buffer schedules from C, C++,
 * Objective-C or Swift (through tap/module.modulemap).  Header-only, C99, POSIX.
 *
 *   #define WORKBENCH_TAP_IMPLEMENTATION     (in ONE .c file, before including it first)
 *   #include "workbench_tap.h"
 *
 * (a) a dump: named tensors (F32, F16, BF16, I32, I64) in one safetensors file whose
 *     __metadata__ carries what `workbench diff` reads: workbench.engine_dtype (the
 *     precision the engine computes in), workbench.ids (the token ids), workbench.decode
 *     ("1": one decode step), workbench.logit_positions ("all" or the positions the head
 *     tensors hold); workbench.op_order (the order the tensors were added in, written at
 *     close unless given: the engine's execution order, which the diff's names matched
 *     by value follow).  docs/diff.md, "Tap from C/C++/Swift".
 * (b) a schedule: buffers, in-place kernels, dispatches with the byte ranges each reads and
 *     writes, barriers, alloc/free, command-buffer commit/complete, as workbench.schedule/1
 *     (docs/schedule.md).  `workbench hazards FILE` reads it.
 *
 * Bounded: names of at most WBT_MAX_NAME bytes of printable ASCII, at most WBT_MAX_TENSORS
 * tensors of at most WBT_MAX_DIMS dims, WBT_MAX_DUMP_BYTES of tensor data, WBT_MAX_BUFFERS
 * buffers, WBT_MAX_ACCESSES accesses a dispatch, WBT_MAX_SCHEDULE_BYTES of schedule (the
 * reader's own limit).  Every function returns 0 or a negative WBT_E* code (wbt_strerror
 * says it in words); nothing aborts, prints or exits.  Atomic: each file is written to an
 * exclusive temporary next to it (O_CREAT|O_EXCL), fsync'ed and renamed into place; a
 * destination that exists and is not a regular file (a symlink, say) is refused, never
 * followed.  One dump or schedule object is used by one thread at a time.
 *
 * (One file of ~780 lines, past the project's ~500 on purpose: a single-header library is
 * copied into an engine's tree as one file.  Declarations first, the implementation after.)
 */
#if defined(WORKBENCH_TAP_IMPLEMENTATION) && !defined(_POSIX_C_SOURCE) && !defined(__APPLE__)
#define _POSIX_C_SOURCE 200809L  /* open, fsync, fdopen, lstat under -std=c99 */
#endif
#ifndef WORKBENCH_TAP_H
#define WORKBENCH_TAP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef WBT_MAX_NAME
#define WBT_MAX_NAME 256
#endif
#ifndef WBT_MAX_TENSORS
#define WBT_MAX_TENSORS 65536
#endif
#ifndef WBT_MAX_DIMS
#define WBT_MAX_DIMS 8
#endif
#ifndef WBT_MAX_DUMP_BYTES
#define WBT_MAX_DUMP_BYTES ((uint64_t)4 << 30)
#endif
#ifndef WBT_MAX_META
#define WBT_MAX_META 64
#endif
#ifndef WBT_MAX_META_VALUE
#define WBT_MAX_META_VALUE (1 << 20)
#endif
#ifndef WBT_MAX_BUFFERS
#define WBT_MAX_BUFFERS 65536
#endif
#ifndef WBT_MAX_KERNELS
#define WBT_MAX_KERNELS 4096
#endif
#ifndef WBT_MAX_ACCESSES
#define WBT_MAX_ACCESSES 64
#endif
#ifndef WBT_MAX_SCHEDULE_BYTES
#define WBT_MAX_SCHEDULE_BYTES ((uint64_t)256 << 20)
#endif

enum {
    WBT_OK = 0,
    WBT_EINVAL = -1,    /* a NULL or out-of-range argument, an unknown dtype */
    WBT_ENAME = -2,     /* a name empty, longer than WBT_MAX_NAME or not printable ASCII */
    WBT_ETOOMANY = -3,  /* past WBT_MAX_TENSORS / _META / _BUFFERS / _KERNELS / _ACCESSES */
    WBT_ETOOBIG = -4,   /* past WBT_MAX_DUMP_BYTES / WBT_MAX_SCHEDULE_BYTES, or a size overflow */
    WBT_ENOMEM = -5,
    WBT_EIO = -6,       /* the temporary could not be made, written, synced or renamed */
    WBT_EDEST = -7,     /* the destination exists and is not a regular file (a symlink) */
    WBT_EDUP = -8,      /* a tensor, buffer or metadata key given twice */
    WBT_EUNKNOWN = -9,  /* an access names a buffer neither declared nor allocated */
    WBT_ESTATE = -10    /* used after an error that left it unusable */
};

typedef enum { WBT_F32, WBT_F16, WBT_BF16, WBT_I32, WBT_I64 } wbt_dtype;

const char *wbt_strerror(int code);
uint16_t wbt_f32_to_f16(float x);   /* round to nearest even; past 65504 -> inf */
float wbt_f16_to_f32(uint16_t h);
uint16_t wbt_f32_to_bf16(float x);  /* round to nearest even; NaN stays NaN */
float wbt_bf16_to_f32(uint16_t h);

/* ---- (a) dumps */
typedef struct wbt_dump wbt_dump;
int wbt_dump_open(wbt_dump **out, const char *path);
/* raw little-endian elements of dtype; shape[0..ndim) (ndim 0: a scalar) */
int wbt_dump_add(wbt_dump *d, const char *name, wbt_dtype dtype, const int64_t *shape, int ndim,
                 const void *data);
/* float32 values stored as dtype WBT_F32, WBT_F16 or WBT_BF16 (converted here) */
int wbt_dump_add_f32(wbt_dump *d, const char *name, wbt_dtype as, const int64_t *shape, int ndim,
                     const float *data);
int wbt_dump_meta(wbt_dump *d, const char *key, const char *value);
int wbt_dump_precision(wbt_dump *d, const char *dtype);          /* "float32" | "bfloat16" | "float16" */
int wbt_dump_ids(wbt_dump *d, const int64_t *ids, size_t n);
/* the head's positions: n == 0 -> "all"; decode: the dump is one decode step */
int wbt_dump_positions(wbt_dump *d, const int64_t *positions, size_t n, int decode);
int wbt_dump_close(wbt_dump *d);  /* write, fsync, rename; frees d whatever it returns */
void wbt_dump_discard(wbt_dump *d);

/* ---- (b) schedules */
typedef struct wbt_sched wbt_sched;
typedef struct {
    const char *arg;     /* the kernel's argument name, NULL: read0 / write0 ... */
    const char *buffer;  /* a declared or allocated buffer id */
    uint64_t offset, size;
    const char *value;   /* label of the logical tensor written / expected, NULL: none */
} wbt_access;
int wbt_sched_open(wbt_sched **out, const char *path, int concurrent);
int wbt_sched_buffer(wbt_sched *s, const char *id, uint64_t size, int initialized);
int wbt_sched_inplace(wbt_sched *s, const char *kernel, const char *read_arg, const char *write_arg);
int wbt_sched_dispatch(wbt_sched *s, const char *name, const char *kernel, int64_t cb,
                       const wbt_access *reads, size_t nreads, const wbt_access *writes, size_t nwrites);
int wbt_sched_barrier(wbt_sched *s);
int wbt_sched_alloc(wbt_sched *s, const char *id, uint64_t size, int initialized);
int wbt_sched_free(wbt_sched *s, const char *id);
int64_t wbt_sched_begin(wbt_sched *s);               /* a new command buffer id (1, 2, ...) */
int wbt_sched_commit(wbt_sched *s, int64_t cb);
int wbt_sched_complete(wbt_sched *s, int64_t cb);    /* after waitUntilCompleted */
int wbt_sched_close(wbt_sched *s);  /* write, fsync, rename; frees s whatever it returns */
void wbt_sched_discard(wbt_sched *s);

#ifdef __cplusplus
}
#endif
#endif /* WORKBENCH_TAP_H */


/* ======================================================================= implementation */
#if defined(WORKBENCH_TAP_IMPLEMENTATION) && !defined(WORKBENCH_TAP_IMPLEMENTED)
#define WORKBENCH_TAP_IMPLEMENTED
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *wbt_strerror(int code) {
    switch (code) {
    case WBT_OK: return "ok";
    case WBT_EINVAL: return "invalid argument";
    case WBT_ENAME: return "name empty, too long or not printable ASCII";
    case WBT_ETOOMANY: return "too many tensors, keys, buffers, kernels or accesses";
    case WBT_ETOOBIG: return "too many bytes";
    case WBT_ENOMEM: return "out of memory";
    case WBT_EIO: return "could not write the file";
    case WBT_EDEST: return "the destination exists and is not a regular file (a symlink?): refused";
    case WBT_EDUP: return "name given twice";
    case WBT_EUNKNOWN: return "buffer neither declared nor allocated";
    case WBT_ESTATE: return "unusable after an earlier error";
    default: return "unknown error";
    }
}

/* ---- half-precision conversions (bit exact, round to nearest even) */
static uint32_t wbt__bits(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static float wbt__float(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

uint16_t wbt_f32_to_f16(float x) {
    uint32_t u = wbt__bits(x), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);       /* rounds past 65504: inf */
    if (a < 0x38800000u) {                                         /* subnormal or zero */
        uint32_t m = (a & 0x7fffffu) | 0x800000u, e = a >> 23;
        if (e < 102) return (uint16_t)sign;
        {
            uint32_t shift = 126 - e, h = m >> shift, rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
            if (rest > half || (rest == half && (h & 1u))) h++;
            return (uint16_t)(sign | h);
        }
    }
    {
        uint32_t h = ((a - 0x38000000u) >> 13), rest = a & 0x1fffu;
        if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
        return (uint16_t)(sign | h);
    }
}

float wbt_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return wbt__float(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        float v = (float)m * (1.0f / 16777216.0f);  /* m * 2^-24 */
        return sign ? -v : v;
    }
    return wbt__float(sign | ((e + 112) << 23) | (m << 13));
}

uint16_t wbt_f32_to_bf16(float x) {
    uint32_t u = wbt__bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float wbt_bf16_to_f32(uint16_t h) { return wbt__float((uint32_t)h << 16); }

/* ---- small helpers: names, a string set, a growable text, the atomic file */
static int wbt__name_ok(const char *s) {
    size_t n = 0;
    if (!s) return WBT_EINVAL;
    for (; s[n]; n++)
        if (n >= WBT_MAX_NAME || (unsigned char)s[n] < 0x20 || (unsigned char)s[n] > 0x7e) return WBT_ENAME;
    return n ? WBT_OK : WBT_ENAME;
}

typedef struct { char **slot; size_t cap, n; } wbt__set;
static uint64_t wbt__hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    while (*s) h = (h ^ (unsigned char)*s++) * 1099511628211ull;
    return h;
}
static char **wbt__find(const wbt__set *t, const char *s) {
    size_t i = (size_t)(wbt__hash(s) & (t->cap - 1));
    while (t->slot[i] && strcmp(t->slot[i], s) != 0) i = (i + 1) & (t->cap - 1);
    return &t->slot[i];
}
static int wbt__has(const wbt__set *t, const char *s) { return t->cap && *wbt__find(t, s) != NULL; }
/* add s (copied); WBT_EDUP if present */
static int wbt__add(wbt__set *t, const char *s) {
    char **at;
    size_t len;
    if (2 * (t->n + 1) > t->cap) {
        size_t i, cap = t->cap ? 2 * t->cap : 64;
        wbt__set g;
        g.slot = (char **)calloc(cap, sizeof(char *));
        if (!g.slot) return WBT_ENOMEM;
        g.cap = cap;
        g.n = t->n;
        for (i = 0; i < t->cap; i++)
            if (t->slot[i]) *wbt__find(&g, t->slot[i]) = t->slot[i];
        free(t->slot);
        *t = g;
    }
    at = wbt__find(t, s);
    if (*at) return WBT_EDUP;
    len = strlen(s) + 1;
    if (!(*at = (char *)malloc(len))) return WBT_ENOMEM;
    memcpy(*at, s, len);
    t->n++;
    return WBT_OK;
}
static void wbt__set_free(wbt__set *t) {
    size_t i;
    for (i = 0; i < t->cap; i++) free(t->slot[i]);
    free(t->slot);
    t->slot = NULL;
    t->cap = t->n = 0;
}

typedef struct { char *p; size_t n, cap; uint64_t limit; int err; } wbt__text;
static void wbt__put(wbt__text *b, const char *s, size_t n) {
    if (b->err) return;
    if ((uint64_t)b->n + n > b->limit) { b->err = WBT_ETOOBIG; return; }
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        char *q;
        while (cap < b->n + n + 1) cap *= 2;
        if (!(q = (char *)realloc(b->p, cap))) { b->err = WBT_ENOMEM; return; }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void wbt__puts(wbt__text *b, const char *s) { wbt__put(b, s, strlen(s)); }
static void wbt__int(wbt__text *b, int64_t v) {
    char tmp[32];
    sprintf(tmp, "%lld", (long long)v);
    wbt__puts(b, tmp);
}
static void wbt__str(wbt__text *b, const char *s) {  /* a JSON string (s: printable ASCII or any) */
    char esc[8];
    wbt__put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') { esc[0] = '\\'; esc[1] = (char)c; wbt__put(b, esc, 2); }
        else if (c < 0x20 || c > 0x7e) { sprintf(esc, "\\u%04x", c); wbt__put(b, esc, 6); }
        else wbt__put(b, (const char *)s, 1);
    }
    wbt__put(b, "\"", 1);
}

typedef struct { char *path, *tmp; int fd; } wbt__file;
/* refuse a destination that exists and is not a regular file (never followed) */
static int wbt__dest_ok(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? WBT_OK : WBT_EIO;
    return S_ISREG(st.st_mode) ? WBT_OK : WBT_EDEST;
}
static int wbt__open(wbt__file *f, const char *path) {
    static unsigned counter;
    size_t n = strlen(path);
    int rc, tries;
    f->fd = -1;
    f->tmp = NULL;
    if (!n || n > 4096) return WBT_EINVAL;
    if ((rc = wbt__dest_ok(path)) != WBT_OK) return rc;
    f->path = (char *)malloc(n + 1);
    f->tmp = (char *)malloc(n + 48);
    if (!f->path || !f->tmp) { free(f->path); free(f->tmp); f->tmp = NULL; return WBT_ENOMEM; }
    memcpy(f->path, path, n + 1);
    for (tries = 0; tries < 100 && f->fd < 0; tries++) {
        sprintf(f->tmp, "%s.tmp-%ld-%u", path, (long)getpid(), counter++);
        f->fd = open(f->tmp, O_WRONLY | O_CREAT | O_EXCL, 0644);
        if (f->fd < 0 && errno != EEXIST) break;
    }
    if (f->fd < 0) { free(f->path); free(f->tmp); f->tmp = NULL; return WBT_EIO; }
    return WBT_OK;
}
static int wbt__write(wbt__file *f, const void *p, size_t n) {
    const char *c = (const char *)p;
    while (n) {
        ssize_t w = write(f->fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return WBT_EIO;
        c += w;
        n -= (size_t)w;
    }
    return WBT_OK;
}
/* rc == WBT_OK: fsync and rename into place; else remove the temporary */
static int wbt__finish(wbt__file *f, int rc) {
    if (!f->tmp) return rc;
    if (rc == WBT_OK && fsync(f->fd) != 0) rc = WBT_EIO;
    if (close(f->fd) != 0 && rc == WBT_OK) rc = WBT_EIO;
    if (rc == WBT_OK) rc = wbt__dest_ok(f->path);
    if (rc == WBT_OK && rename(f->tmp, f->path) != 0) rc = WBT_EIO;
    if (rc != WBT_OK) unlink(f->tmp);
    free(f->path);
    free(f->tmp);
    f->tmp = NULL;
    return rc;
}

/* ---- (a) dumps: tensors held until close, then header + data written at once */
typedef struct { char *name; wbt_dtype dt; int nd; int64_t shape[WBT_MAX_DIMS]; uint64_t nbytes; void *data; } wbt__tensor;
struct wbt_dump {
    wbt__file f;
    wbt__tensor *t;
    size_t n, cap;
    uint64_t total;
    wbt__set names, keys;
    char *key[WBT_MAX_META], *val[WBT_MAX_META];
    size_t nmeta;
    int err;
};
static const char *const wbt__dtname[] = {"F32", "F16", "BF16", "I32", "I64"};
static const unsigned wbt__dtsize[] = {4, 2, 2, 4, 8};

int wbt_dump_open(wbt_dump **out, const char *path) {
    wbt_dump *d;
    int rc;
    if (!out || !path) return WBT_EINVAL;
    *out = NULL;
    if (!(d = (wbt_dump *)calloc(1, sizeof *d))) return WBT_ENOMEM;
    if ((rc = wbt__open(&d->f, path)) != WBT_OK) { free(d); return rc; }
    *out = d;
    return WBT_OK;
}

/* the tensor's slot and byte count, checked; data copied by the callers */
static int wbt__slot(wbt_dump *d, const char *name, wbt_dtype dt, const int64_t *shape, int nd, wbt__tensor **t) {
    uint64_t count = 1;
    int i, rc;
    if (!d || (nd && !shape) || nd < 0 || nd > WBT_MAX_DIMS || (int)dt < 0 || (int)dt > WBT_I64) return WBT_EINVAL;
    if (d->err) return WBT_ESTATE;
    if ((rc = wbt__name_ok(name)) != WBT_OK) return rc;
    if (!strcmp(name, "__metadata__")) return WBT_ENAME;
    if (d->n >= WBT_MAX_TENSORS) return WBT_ETOOMANY;
    for (i = 0; i < nd; i++) {
        if (shape[i] < 0) return WBT_EINVAL;
        if (shape[i] && count > WBT_MAX_DUMP_BYTES / (uint64_t)shape[i]) return WBT_ETOOBIG;
        count *= (uint64_t)shape[i];
    }
    if (count > (WBT_MAX_DUMP_BYTES - d->total) / wbt__dtsize[dt]) return WBT_ETOOBIG;
    if (d->n == d->cap) {
        size_t cap = d->cap ? 2 * d->cap : 64;
        wbt__tensor *g = (wbt__tensor *)realloc(d->t, cap * sizeof *g);
        if (!g) return WBT_ENOMEM;
        d->t = g;
        d->cap = cap;
    }
    if ((rc = wbt__add(&d->names, name)) != WBT_OK) return rc;
    *t = &d->t[d->n];
    memset(*t, 0, sizeof **t);
    (*t)->nbytes = count * wbt__dtsize[dt];
    (*t)->data = malloc((*t)->nbytes ? (size_t)(*t)->nbytes : 1);
    (*t)->name = *wbt__find(&d->names, name);
    if (!(*t)->data) return WBT_ENOMEM;  /* (the name stays taken) */
    (*t)->dt = dt;
    (*t)->nd = nd;
    for (i = 0; i < nd; i++) (*t)->shape[i] = shape[i];
    return WBT_OK;
}

int wbt_dump_add(wbt_dump *d, const char *name, wbt_dtype dtype, const int64_t *shape, int ndim, const void *data) {
    wbt__tensor *t;
    int rc;
    if (!data) return WBT_EINVAL;
    if ((rc = wbt__slot(d, name, dtype, shape, ndim, &t)) != WBT_OK) return rc;
    memcpy(t->data, data, (size_t)t->nbytes);
    d->total += t->nbytes;
    d->n++;
    return WBT_OK;
}

int wbt_dump_add_f32(wbt_dump *d, const char *name, wbt_dtype as, const int64_t *shape, int ndim, const float *data) {
    wbt__tensor *t;
    uint64_t i, n;
    int rc;
    if (!data || (as != WBT_F32 && as != WBT_F16 && as != WBT_BF16)) return WBT_EINVAL;
    if ((rc = wbt__slot(d, name, as, shape, ndim, &t)) != WBT_OK) return rc;
    n = t->nbytes / wbt__dtsize[as];
    for (i = 0; i < n; i++) {
        uint16_t h = as == WBT_F16 ? wbt_f32_to_f16(data[i]) : wbt_f32_to_bf16(data[i]);
        if (as == WBT_F32) memcpy((char *)t->data + 4 * i, &data[i], 4);
        else { ((unsigned char *)t->data)[2 * i] = (unsigned char)(h & 0xff); ((unsigned char *)t->data)[2 * i + 1] = (unsigned char)(h >> 8); }
    }
    d->total += t->nbytes;
    d->n++;
    return WBT_OK;
}

int wbt_dump_meta(wbt_dump *d, const char *key, const char *value) {
    size_t vn;
    int rc;
    if (!d || !value) return WBT_EINVAL;
    if (d->err) return WBT_ESTATE;
    if ((rc = wbt__name_ok(key)) != WBT_OK) return rc;
    if (d->nmeta >= WBT_MAX_META) return WBT_ETOOMANY;
    if ((vn = strlen(value)) > WBT_MAX_META_VALUE) return WBT_ETOOBIG;
    if ((rc = wbt__add(&d->keys, key)) != WBT_OK) return rc;
    d->key[d->nmeta] = *wbt__find(&d->keys, key);
    if (!(d->val[d->nmeta] = (char *)malloc(vn + 1))) return WBT_ENOMEM;
    memcpy(d->val[d->nmeta], value, vn + 1);
    d->nmeta++;
    return WBT_OK;
}

int wbt_dump_precision(wbt_dump *d, const char *dtype) {
    if (!dtype || (strcmp(dtype, "float32") && strcmp(dtype, "bfloat16") && strcmp(dtype, "float16"))) return WBT_EINVAL;
    return wbt_dump_meta(d, "workbench.engine_dtype", dtype);
}

static int wbt__list_meta(wbt_dump *d, const char *key, const int64_t *v, size_t n) {
    wbt__text b = {NULL, 0, 0, WBT_MAX_META_VALUE, 0};
    size_t i;
    int rc;
    if (n && !v) return WBT_EINVAL;
    wbt__puts(&b, "[");
    for (i = 0; i < n; i++) {
        if (i) wbt__puts(&b, ",");
        wbt__int(&b, v[i]);
    }
    wbt__puts(&b, "]");
    rc = b.err ? b.err : wbt_dump_meta(d, key, b.p);
    free(b.p);
    return rc;
}

int wbt_dump_ids(wbt_dump *d, const int64_t *ids, size_t n) { return wbt__list_meta(d, "workbench.ids", ids, n); }

int wbt_dump_positions(wbt_dump *d, const int64_t *positions, size_t n, int decode) {
    int rc = n ? wbt__list_meta(d, "workbench.logit_positions", positions, n)
               : wbt_dump_meta(d, "workbench.logit_positions", "\"all\"");  /* JSON text */
    return rc != WBT_OK ? rc : wbt_dump_meta(d, "workbench.decode", decode ? "1" : "0");
}

static void wbt__dump_free(wbt_dump *d) {
    size_t i;
    for (i = 0; i < d->n; i++) free(d->t[i].data);
    for (i = 0; i < d->nmeta; i++) free(d->val[i]);
    free(d->t);
    wbt__set_free(&d->names);
    wbt__set_free(&d->keys);
    free(d);
}

int wbt_dump_close(wbt_dump *d) {
    wbt__text h = {NULL, 0, 0, (uint64_t)100 << 20, 0};  /* safetensors readers cap the header at 100 MB */
    uint64_t off = 0, len;
    size_t i;
    int j, rc, order_given = 0;
    unsigned char le[8];
    if (!d) return WBT_EINVAL;
    wbt__puts(&h, "{\"__metadata__\":{");
    for (i = 0; i < d->nmeta; i++) {
        if (i) wbt__puts(&h, ",");
        wbt__str(&h, d->key[i]);
        wbt__puts(&h, ":");
        wbt__str(&h, d->val[i]);
        if (!strcmp(d->key[i], "workbench.op_order")) order_given = 1;
    }
    if (!order_given && d->n) {  /* the order tensors were added in: the engine's execution order */
        wbt__text o = {NULL, 0, 0, (uint64_t)64 << 20, 0};
        wbt__puts(&o, "[");
        for (i = 0; i < d->n; i++) {
            if (i) wbt__puts(&o, ",");
            wbt__str(&o, d->t[i].name);
        }
        wbt__puts(&o, "]");
        if (d->nmeta) wbt__puts(&h, ",");
        wbt__str(&h, "workbench.op_order");
        wbt__puts(&h, ":");
        if (o.err) h.err = o.err; else wbt__str(&h, o.p);
        free(o.p);
    }
    wbt__puts(&h, "}");
    for (i = 0; i < d->n; i++) {
        const wbt__tensor *t = &d->t[i];
        wbt__puts(&h, ",");
        wbt__str(&h, t->name);
        wbt__puts(&h, ":{\"dtype\":\"");
        wbt__puts(&h, wbt__dtname[t->dt]);
        wbt__puts(&h, "\",\"shape\":[");
        for (j = 0; j < t->nd; j++) {
            if (j) wbt__puts(&h, ",");
            wbt__int(&h, t->shape[j]);
        }
        wbt__puts(&h, "],\"data_offsets\":[");
        wbt__int(&h, (int64_t)off);
        wbt__puts(&h, ",");
        off += t->nbytes;
        wbt__int(&h, (int64_t)off);
        wbt__puts(&h, "]}");
    }
    wbt__puts(&h, "}");
    while (!h.err && h.n % 8) wbt__puts(&h, " ");  /* the data section 8-byte aligned */
    rc = d->err ? WBT_ESTATE : h.err;
    len = h.n;
    for (j = 0; j < 8; j++) le[j] = (unsigned char)(len >> (8 * j));
    if (rc == WBT_OK) rc = wbt__write(&d->f, le, 8);
    if (rc == WBT_OK) rc = wbt__write(&d->f, h.p, h.n);
    for (i = 0; rc == WBT_OK && i < d->n; i++) rc = wbt__write(&d->f, d->t[i].data, (size_t)d->t[i].nbytes);
    rc = wbt__finish(&d->f, rc);
    free(h.p);
    wbt__dump_free(d);
    return rc;
}

void wbt_dump_discard(wbt_dump *d) {
    if (!d) return;
    wbt__finish(&d->f, WBT_ESTATE);
    wbt__dump_free(d);
}

/* ---- (b) schedules: events streamed to the temporary as they come; buffers and kernels
 * (JSON object keys, in any order) written after them at close */
struct wbt_sched {
    wbt__file f;
    wbt__text buf, ker, ev;   /* "buffers" and "kernels" members; the event being made */
    wbt__set known, kernels;
    uint64_t written;
    int64_t next_cb;
    int nevents, err;
};

static int wbt__flush(wbt_sched *s) {  /* the event made in s->ev, to the file */
    int rc = s->ev.err;
    if (rc == WBT_OK && s->written + s->ev.n + 2 > WBT_MAX_SCHEDULE_BYTES) rc = WBT_ETOOBIG;
    if (rc == WBT_OK) rc = wbt__write(&s->f, s->nevents ? ",\n" : "\n", s->nevents ? 2 : 1);
    if (rc == WBT_OK) rc = wbt__write(&s->f, s->ev.p, s->ev.n);
    s->written += s->ev.n + 2;
    s->ev.n = 0;
    s->ev.err = 0;
    if (rc != WBT_OK) s->err = rc;
    else s->nevents++;
    return rc;
}

int wbt_sched_open(wbt_sched **out, const char *path, int concurrent) {
    static const char *const head[] = {"{\"format\":\"workbench.schedule/1\",\"mode\":\"serial\",\"events\":[",
                                       "{\"format\":\"workbench.schedule/1\",\"mode\":\"concurrent\",\"events\":["};
    wbt_sched *s;
    int rc;
    if (!out || !path) return WBT_EINVAL;
    *out = NULL;
    if (!(s = (wbt_sched *)calloc(1, sizeof *s))) return WBT_ENOMEM;
    s->buf.limit = s->ker.limit = WBT_MAX_SCHEDULE_BYTES / 4;
    s->ev.limit = (uint64_t)WBT_MAX_ACCESSES * 4 * (WBT_MAX_NAME * 3 + 128);
    if ((rc = wbt__open(&s->f, path)) != WBT_OK) { free(s); return rc; }
    rc = wbt__write(&s->f, head[concurrent != 0], strlen(head[concurrent != 0]));
    if (rc != WBT_OK) { wbt__finish(&s->f, rc); free(s); return rc; }
    s->written = strlen(head[0]) + 2;
    s->next_cb = 1;
    *out = s;
    return WBT_OK;
}

static int wbt__ready(const wbt_sched *s) { return !s ? WBT_EINVAL : s->err ? WBT_ESTATE : WBT_OK; }
static int wbt__bytes(uint64_t v) { return v <= ((uint64_t)1 << 62) ? WBT_OK : WBT_ETOOBIG; }

int wbt_sched_buffer(wbt_sched *s, const char *id, uint64_t size, int initialized) {
    int rc;
    if ((rc = wbt__ready(s)) || (rc = wbt__name_ok(id)) || (rc = wbt__bytes(size))) return rc;
    if (s->known.n >= WBT_MAX_BUFFERS) return WBT_ETOOMANY;
    if ((rc = wbt__add(&s->known, id)) != WBT_OK) return rc;
    wbt__puts(&s->buf, s->buf.n ? "," : "");
    wbt__str(&s->buf, id);
    wbt__puts(&s->buf, ":{\"size\":");
    wbt__int(&s->buf, (int64_t)size);
    wbt__puts(&s->buf, initialized ? ",\"initialized\":true}" : "}");
    return s->buf.err ? (s->err = s->buf.err) : WBT_OK;
}

int wbt_sched_inplace(wbt_sched *s, const char *kernel, const char *read_arg, const char *write_arg) {
    int rc;
    if ((rc = wbt__ready(s)) || (rc = wbt__name_ok(kernel)) || (rc = wbt__name_ok(read_arg)) ||
        (rc = wbt__name_ok(write_arg)))
        return rc;
    if (s->kernels.n >= WBT_MAX_KERNELS) return WBT_ETOOMANY;
    if ((rc = wbt__add(&s->kernels, kernel)) != WBT_OK) return rc;  /* one pair a kernel */
    wbt__puts(&s->ker, s->ker.n ? "," : "");
    wbt__str(&s->ker, kernel);
    wbt__puts(&s->ker, ":{\"inplace\":[[");
    wbt__str(&s->ker, read_arg);
    wbt__puts(&s->ker, ",");
    wbt__str(&s->ker, write_arg);
    wbt__puts(&s->ker, "]]}");
    return s->ker.err ? (s->err = s->ker.err) : WBT_OK;
}

static int wbt__accesses(wbt_sched *s, const char *key, const wbt_access *a, size_t n) {
    size_t i;
    int rc;
    if (n > WBT_MAX_ACCESSES) return WBT_ETOOMANY;
    if (n && !a) return WBT_EINVAL;
    for (i = 0; i < n; i++) {
        if ((rc = wbt__name_ok(a[i].buffer)) || (a[i].arg && (rc = wbt__name_ok(a[i].arg))) ||
            (a[i].value && (rc = wbt__name_ok(a[i].value))) || (rc = wbt__bytes(a[i].offset)) ||
            (rc = wbt__bytes(a[i].size)))
            return rc;
        if (!wbt__has(&s->known, a[i].buffer)) return WBT_EUNKNOWN;
    }
    wbt__puts(&s->ev, ",\"");
    wbt__puts(&s->ev, key);
    wbt__puts(&s->ev, "\":[");
    for (i = 0; i < n; i++) {
        wbt__puts(&s->ev, i ? ",{" : "{");
        if (a[i].arg) { wbt__puts(&s->ev, "\"arg\":"); wbt__str(&s->ev, a[i].arg); wbt__puts(&s->ev, ","); }
        wbt__puts(&s->ev, "\"buffer\":");
        wbt__str(&s->ev, a[i].buffer);
        wbt__puts(&s->ev, ",\"offset\":");
        wbt__int(&s->ev, (int64_t)a[i].offset);
        wbt__puts(&s->ev, ",\"size\":");
        wbt__int(&s->ev, (int64_t)a[i].size);
        if (a[i].value) { wbt__puts(&s->ev, ",\"value\":"); wbt__str(&s->ev, a[i].value); }
        wbt__puts(&s->ev, "}");
    }
    wbt__puts(&s->ev, "]");
    return WBT_OK;
}

int wbt_sched_dispatch(wbt_sched *s, const char *name, const char *kernel, int64_t cb,
                       const wbt_access *reads, size_t nreads, const wbt_access *writes, size_t nwrites) {
    int rc;
    if ((rc = wbt__ready(s)) || (rc = wbt__name_ok(name)) || (kernel && (rc = wbt__name_ok(kernel)))) return rc;
    s->ev.n = 0;
    wbt__puts(&s->ev, "{\"type\":\"dispatch\",\"name\":");
    wbt__str(&s->ev, name);
    if (kernel) { wbt__puts(&s->ev, ",\"kernel\":"); wbt__str(&s->ev, kernel); }
    if (cb >= 0) { wbt__puts(&s->ev, ",\"cb\":"); wbt__int(&s->ev, cb); }
    if ((rc = wbt__accesses(s, "reads", reads, nreads)) || (rc = wbt__accesses(s, "writes", writes, nwrites))) {
        s->ev.n = 0;
        return rc;  /* nothing written: the schedule stays usable */
    }
    wbt__puts(&s->ev, "}");
    return wbt__flush(s);
}

static int wbt__simple(wbt_sched *s, const char *type, const char *id, int64_t cb, int with_cb) {
    int rc;
    if ((rc = wbt__ready(s)) || (id && (rc = wbt__name_ok(id)))) return rc;
    if (id && !strcmp(type, "free") && !wbt__has(&s->known, id)) return WBT_EUNKNOWN;
    s->ev.n = 0;
    wbt__puts(&s->ev, "{\"type\":\"");
    wbt__puts(&s->ev, type);
    wbt__puts(&s->ev, "\"");
    if (id) { wbt__puts(&s->ev, ",\"buffer\":"); wbt__str(&s->ev, id); }
    if (with_cb) { wbt__puts(&s->ev, ",\"cb\":"); wbt__int(&s->ev, cb); }
    return s->ev.err ? s->ev.err : WBT_OK;
}

int wbt_sched_barrier(wbt_sched *s) {
    int rc = wbt__simple(s, "barrier", NULL, 0, 0);
    if (rc) return rc;
    wbt__puts(&s->ev, "}");
    return wbt__flush(s);
}

int wbt_sched_alloc(wbt_sched *s, const char *id, uint64_t size, int initialized) {
    int rc = wbt__simple(s, "alloc", id, 0, 0);
    if (rc || (rc = wbt__bytes(size))) return rc;
    if (!wbt__has(&s->known, id)) {
        if (s->known.n >= WBT_MAX_BUFFERS) return WBT_ETOOMANY;
        if ((rc = wbt__add(&s->known, id)) != WBT_OK) return rc;
    }
    wbt__puts(&s->ev, ",\"size\":");
    wbt__int(&s->ev, (int64_t)size);
    wbt__puts(&s->ev, initialized ? ",\"initialized\":true}" : "}");
    return wbt__flush(s);
}

int wbt_sched_free(wbt_sched *s, const char *id) {
    int rc = id ? wbt__simple(s, "free", id, 0, 0) : WBT_EINVAL;
    if (rc) return rc;
    wbt__puts(&s->ev, "}");
    return wbt__flush(s);
}

int64_t wbt_sched_begin(wbt_sched *s) {
    if (!s) return (int64_t)WBT_EINVAL;
    return s->err ? (int64_t)WBT_ESTATE : s->next_cb++;
}

int wbt_sched_commit(wbt_sched *s, int64_t cb) {
    int rc = cb < 0 ? WBT_EINVAL : wbt__simple(s, "commit", NULL, cb, 1);
    if (rc) return rc;
    wbt__puts(&s->ev, "}");
    return wbt__flush(s);
}

int wbt_sched_complete(wbt_sched *s, int64_t cb) {
    int rc = cb < 0 ? WBT_EINVAL : wbt__simple(s, "complete", NULL, cb, 1);
    if (rc) return rc;
    wbt__puts(&s->ev, "}");
    return wbt__flush(s);
}

static void wbt__sched_free(wbt_sched *s) {
    free(s->buf.p);
    free(s->ker.p);
    free(s->ev.p);
    wbt__set_free(&s->known);
    wbt__set_free(&s->kernels);
    free(s);
}

int wbt_sched_close(wbt_sched *s) {
    int rc;
    if (!s) return WBT_EINVAL;
    rc = s->err;
    s->ev.n = 0;
    s->ev.limit = WBT_MAX_SCHEDULE_BYTES;
    wbt__puts(&s->ev, "\n],\"buffers\":{");
    wbt__put(&s->ev, s->buf.p ? s->buf.p : "", s->buf.n);
    wbt__puts(&s->ev, "},\"kernels\":{");
    wbt__put(&s->ev, s->ker.p ? s->ker.p : "", s->ker.n);
    wbt__puts(&s->ev, "}}\n");
    if (rc == WBT_OK) rc = s->ev.err;
    if (rc == WBT_OK && s->written + s->ev.n > WBT_MAX_SCHEDULE_BYTES) rc = WBT_ETOOBIG;
    if (rc == WBT_OK) rc = wbt__write(&s->f, s->ev.p, s->ev.n);
    rc = wbt__finish(&s->f, rc);
    wbt__sched_free(s);
    return rc;
}

void wbt_sched_discard(wbt_sched *s) {
    if (!s) return;
    wbt__finish(&s->f, WBT_ESTATE);
    wbt__sched_free(s);
}

#endif /* WORKBENCH_TAP_IMPLEMENTATION */
