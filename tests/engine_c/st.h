/* A tiny bounded safetensors reader and config.json scanner for the home-made test engine
 * (engine.c): the file read whole (at most ST_MAX_FILE), its header parsed for dtype,
 * shape and data_offsets only, every offset checked against dtype x shape and the file.
 * Not a general JSON parser: the header's fixed structure and a few config keys. */
#ifndef ENGINE_ST_H
#define ENGINE_ST_H
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ST_MAX_FILE ((size_t)1 << 30)
#define ST_MAX_HEADER ((size_t)16 << 20)
#define ST_MAX_TENSORS 4096
#define ST_MAX_NAME 256

typedef struct { char name[ST_MAX_NAME + 1], dtype[8]; int nd; int64_t shape[4]; const unsigned char *data; size_t nbytes; } st_tensor;
typedef struct { unsigned char *file; size_t size; st_tensor *t; int n; } st_file;

static char *read_all(const char *path, size_t cap, size_t *size) {
    FILE *f = fopen(path, "rb");
    char *buf;
    long n;
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) != 0 || (n = ftell(f)) < 0 || (size_t)n > cap || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return NULL;
    }
    buf = (char *)malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); buf = NULL; }
    fclose(f);
    if (buf) { buf[n] = 0; *size = (size_t)n; }
    return buf;
}

/* -- the header: {"name": {"dtype": "F32", "shape": [..], "data_offsets": [a, b]}, "__metadata__": {...}} */
typedef struct { const char *p, *end; int bad; } st_cur;
static void ws(st_cur *c) { while (c->p < c->end && (*c->p == ' ' || *c->p == '\n' || *c->p == '\r' || *c->p == '\t')) c->p++; }
static int eat(st_cur *c, char ch) { ws(c); if (c->p < c->end && *c->p == ch) { c->p++; return 1; } return 0; }
static void jstr(st_cur *c, char *out, size_t cap) {  /* a string, escapes kept as written */
    size_t n = 0;
    if (!eat(c, '"')) { c->bad = 1; return; }
    while (c->p < c->end && *c->p != '"') {
        if (*c->p == '\\' && c->p + 1 < c->end) { if (n + 1 < cap) out[n++] = *c->p; c->p++; }
        if (n + 1 < cap) out[n++] = *c->p; else if (cap) c->bad = 1;
        c->p++;
    }
    if (c->p >= c->end) c->bad = 1; else c->p++;
    if (cap) out[n < cap ? n : cap - 1] = 0;
}
static int64_t jint(st_cur *c) {
    int64_t v = 0;
    int digits = 0;
    ws(c);
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9' && digits < 18) { v = v * 10 + (*c->p++ - '0'); digits++; }
    if (!digits || (c->p < c->end && *c->p >= '0' && *c->p <= '9')) c->bad = 1;
    return v;
}
static void jints(st_cur *c, int64_t *v, int cap, int *n) {
    *n = 0;
    if (!eat(c, '[')) { c->bad = 1; return; }
    if (eat(c, ']')) return;
    do {
        if (*n >= cap) { c->bad = 1; return; }
        v[(*n)++] = jint(c);
    } while (!c->bad && eat(c, ','));
    if (!eat(c, ']')) c->bad = 1;
}
static void skip_strings_object(st_cur *c) {  /* __metadata__: an object of strings */
    char tmp[8];
    if (!eat(c, '{')) { c->bad = 1; return; }
    if (eat(c, '}')) return;
    do { jstr(c, tmp, 0); if (!eat(c, ':')) c->bad = 1; jstr(c, tmp, 0); } while (!c->bad && eat(c, ','));
    if (!eat(c, '}')) c->bad = 1;
}

static size_t st_dsize(const char *dt) {
    if (!strcmp(dt, "F32") || !strcmp(dt, "U32") || !strcmp(dt, "I32")) return 4;
    if (!strcmp(dt, "BF16") || !strcmp(dt, "F16")) return 2;
    if (!strcmp(dt, "U8")) return 1;
    return 0;
}

/* 0, or a message (static) saying what is wrong */
static const char *st_open(st_file *sf, const char *path) {
    size_t size, hlen = 0;
    int i;
    st_cur c;
    memset(sf, 0, sizeof *sf);
    if (!(sf->file = (unsigned char *)read_all(path, ST_MAX_FILE, &size))) return "cannot read the file (or past 1 GiB)";
    sf->size = size;
    if (size < 8) return "shorter than the 8-byte header length";
    for (i = 7; i >= 0; i--) hlen = (hlen << 8) | sf->file[i];
    if (hlen > ST_MAX_HEADER || hlen > size - 8) return "header length past the file or 16 MiB";
    sf->t = (st_tensor *)calloc(ST_MAX_TENSORS, sizeof(st_tensor));
    if (!sf->t) return "out of memory";
    c.p = (const char *)sf->file + 8;
    c.end = c.p + hlen;
    c.bad = 0;
    if (!eat(&c, '{')) return "header is not a JSON object";
    if (eat(&c, '}')) return NULL;
    do {
        st_tensor *t;
        int64_t off[2], count = 1;
        int no;
        char key[ST_MAX_NAME + 2];
        jstr(&c, key, sizeof key);
        if (c.bad || !eat(&c, ':')) return "header: a key without a value (or a name past 256 bytes)";
        if (!strcmp(key, "__metadata__")) { skip_strings_object(&c); continue; }
        if (sf->n >= ST_MAX_TENSORS) return "more than 4096 tensors";
        t = &sf->t[sf->n++];
        strcpy(t->name, key);
        off[0] = off[1] = -1;
        if (!eat(&c, '{')) return "header: a tensor entry is not an object";
        do {
            char field[16];
            jstr(&c, field, sizeof field);
            if (!eat(&c, ':')) c.bad = 1;
            if (!strcmp(field, "dtype")) jstr(&c, t->dtype, sizeof t->dtype);
            else if (!strcmp(field, "shape")) jints(&c, t->shape, 4, &t->nd);
            else if (!strcmp(field, "data_offsets")) { jints(&c, off, 2, &no); if (no != 2) c.bad = 1; }
            else c.bad = 1;
        } while (!c.bad && eat(&c, ','));
        if (c.bad || !eat(&c, '}')) return "header: a tensor entry is malformed";
        for (i = 0; i < t->nd; i++) {
            if (t->shape[i] > (1 << 30) || count > ((int64_t)1 << 31)) return "a tensor's shape is too large";
            count *= t->shape[i];
        }
        if (!st_dsize(t->dtype)) return "a tensor's dtype is not F32/F16/BF16/U32/I32/U8";
        if (off[0] < 0 || off[1] < off[0] || (uint64_t)off[1] > size - 8 - hlen ||
            (uint64_t)(off[1] - off[0]) != (uint64_t)count * st_dsize(t->dtype))
            return "a tensor's data_offsets disagree with its dtype x shape or the file size";
        t->data = sf->file + 8 + hlen + off[0];
        t->nbytes = (size_t)(off[1] - off[0]);
    } while (!c.bad && eat(&c, ','));
    if (c.bad || !eat(&c, '}')) return "header: malformed JSON";
    return NULL;
}

static const st_tensor *st_get(const st_file *sf, const char *name) {
    int i;
    for (i = 0; i < sf->n; i++)
        if (!strcmp(sf->t[i].name, name)) return &sf->t[i];
    return NULL;
}

static float st_elem(const st_tensor *t, size_t i) {  /* element i as float (F32, F16, BF16) */
    const unsigned char *b = t->data;
    uint32_t u;
    float f;
    if (!strcmp(t->dtype, "F32")) { memcpy(&f, b + 4 * i, 4); return f; }
    u = (uint32_t)b[2 * i] | ((uint32_t)b[2 * i + 1] << 8);
    if (!strcmp(t->dtype, "BF16")) { u <<= 16; memcpy(&f, &u, 4); return f; }
    return wbt_f16_to_f32((uint16_t)u);
}

/* -- config.json: the first number after "key": within [p, end) */
static const char *cfg_find(const char *p, const char *end, const char *key) {
    char q[80];
    size_t n;
    snprintf(q, sizeof q, "\"%s\"", key);
    n = strlen(q);
    for (; p && p + n <= end; p++)
        if (!memcmp(p, q, n)) {
            p += n;
            while (p < end && (*p == ' ' || *p == '\n')) p++;
            return p < end && *p == ':' ? p + 1 : NULL;
        }
    return NULL;
}
static double cfg_num(const char *p, const char *end, const char *key, double dflt) {
    const char *v = cfg_find(p, end, key);
    char *stop;
    double d;
    if (!v) return dflt;
    d = strtod(v, &stop);
    return stop == v ? dflt : d;
}
#endif
