/* A home-made engine for the embedded demo model (Gemma 4 text: per-layer inputs, q/k/v
 * norms, partial "proportional" RoPE on full layers, a sliding window, GeGLU, layer
 * scalars, a tied soft-capped head), float32 on the CPU, libc + libm only.  It names its
 * tensors its own way (tok_emb, blk0.att_q_proj, final_norm, out_proj ...) and writes a dump
 * and a buffer schedule through the workbench tap (tap/workbench_tap.h).
 *
 *   engine MODEL_DIR --ids 2,10,20 --dump OUT.safetensors --schedule OUT.json [--bug NAME] [--dump-weights]
 *
 * --dump-weights adds every weight as the loader made it (dequantized), as w.<checkpoint name>.
 * Planted seed bugs (tests/test_c_engine.py):
 *   alias         layer 1's o_proj writes its output over its input, the attention output (attnH)
 *   reuse-cb      layer 2 is encoded into layer 1's command buffer, already committed
 *   loader-name   full-attention layers looked up as layers.N.attn.* : reported "missing"
 *   mxfp4-affine  4-bit mxfp4 weights dequantized with affine rules (codes as integer levels)
 *   f16-overflow  layer 2's GeGLU in a half-precision kernel: tanh through exp overflows
 * Exit: 0 ran, 2 bad arguments or an unreadable model, 3 tensors "missing". */
#define WORKBENCH_TAP_IMPLEMENTATION
#include "workbench_tap.h"
#include "st.h"

#define USAGE "engine MODEL_DIR --ids 2,10,20 --dump OUT.safetensors --schedule OUT.json [--bug NAME] [--dump-weights]"
#define MAXL 16
#define MAXT 256
enum { BUG_NONE, BUG_ALIAS, BUG_REUSE_CB, BUG_LOADER, BUG_MXFP4, BUG_F16 };
static int bug, dump_weights;
static const char *model_dir;
static st_file sf;
static char qmode[16];
static int qbits, qgroup, missing;
static float *arena;                 /* every weight, dequantized, one "weights" buffer */
static size_t arena_n, arena_cap;

typedef struct { float *p; size_t off, rows, cols; } W;  /* off: elements into the arena */
static struct { char name[300]; W w; } loaded[1024];        /* --dump-weights: what the loader made */
static int nloaded;
typedef struct {
    int D, L, H, I, P, V, window, hd[MAXL], kvh, full[MAXL];
    double eps, cap, theta[2], prf[2];  /* [0] sliding, [1] full */
    W emb, ple_emb, ple_proj, ple_norm, norm;
    struct { W in_norm, q, k, v, o, q_norm, k_norm, post_att, pre_ffn, gate, up, down, post_ffn, pl_gate, pl_proj, pl_norm, scalar; } l[MAXL];
} Model;
static Model m;

static void die(int code, const char *what, const char *detail) {
    fprintf(stderr, "engine: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    exit(code);
}

/* ---- loading: a tensor by name, dequantized to float32 (quantized: .weight/.scales[/.biases]) */
static const float fp4[16] = {0, .5f, 1, 1.5f, 2, 3, 4, 6, -0.f, -.5f, -1, -1.5f, -2, -3, -4, -6};

static W take(const char *name, size_t rows, size_t cols) {
    char full[600], sc[600], bi[600];
    const st_tensor *t, *s, *b;
    W w = {NULL, 0, rows, cols};
    size_t i, n = rows * cols;
    snprintf(full, sizeof full, "%s.weight", name);
    if (!(t = st_get(&sf, full)) && !(t = st_get(&sf, name))) {
        fprintf(stderr, "engine: missing tensor %s\n", full);
        missing++;
        return w;
    }
    if (arena_n + n > arena_cap || nloaded >= 1024) die(2, "weights past the arena", name);
    w.off = arena_n;
    w.p = arena + arena_n;
    arena_n += n;
    snprintf(loaded[nloaded].name, sizeof loaded[nloaded].name, "w.%s", name + (strncmp(name, "model.", 6) ? 0 : 6));
    loaded[nloaded++].w = w;
    snprintf(sc, sizeof sc, "%s.scales", name);
    snprintf(bi, sizeof bi, "%s.biases", name);
    if ((s = st_get(&sf, sc)) != NULL) {  /* packed uint32, `bits` a code, groups of `group` */
        int per = 32 / qbits, mx = !strcmp(qmode, "mxfp4");
        b = st_get(&sf, bi);
        if (strcmp(t->dtype, "U32") || t->nbytes * per != n * 4 || s->nbytes * qgroup != n * st_dsize(s->dtype) ||
            (b && b->nbytes != s->nbytes) || (mx && strcmp(s->dtype, "U8")) || (!mx && !b))
            die(2, "quantized tensor of an unexpected layout", full);
        for (i = 0; i < n; i++) {
            uint32_t word;
            unsigned code;
            size_t g = i / (size_t)qgroup;
            memcpy(&word, t->data + 4 * (i / per), 4);
            code = (word >> (qbits * (i % per))) & ((1u << qbits) - 1);
            if (mx) {
                float scale = ldexpf(1.0f, (int)s->data[g] - 127);
                w.p[i] = bug == BUG_MXFP4 ? scale * (float)code   /* the bug: affine rules, no biases */
                                          : scale * fp4[code];
            } else
                w.p[i] = st_elem(s, g) * (float)code + st_elem(b, g);
        }
        return w;
    }
    if (t->nbytes != n * st_dsize(t->dtype) || !strcmp(t->dtype, "U32")) die(2, "tensor of an unexpected shape", full);
    for (i = 0; i < n; i++) w.p[i] = st_elem(t, i);
    return w;
}

static W layer_w(int i, const char *what, size_t rows, size_t cols) {
    char name[300];
    /* the planted loader bug: full-attention layers looked up under another pattern */
    if (bug == BUG_LOADER && m.full[i] && !strncmp(what, "self_attn.", 10))
        snprintf(name, sizeof name, "model.layers.%d.attn.%s", i, what + 10);
    else
        snprintf(name, sizeof name, "model.layers.%d.%s", i, what);
    return take(name, rows, cols);
}

static void load(void) {
    char path[1200], *cfg;
    const char *e, *lt, *rp, *q;
    size_t size;
    int i, H;
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    if (!(cfg = read_all(path, 1 << 20, &size))) die(2, "cannot read", path);
    e = cfg + size;
    m.D = (int)cfg_num(cfg, e, "hidden_size", 0);
    m.L = (int)cfg_num(cfg, e, "num_hidden_layers", 0);
    H = m.H = (int)cfg_num(cfg, e, "num_attention_heads", 0);
    m.kvh = (int)cfg_num(cfg, e, "num_key_value_heads", 0);
    m.I = (int)cfg_num(cfg, e, "intermediate_size", 0);
    m.P = (int)cfg_num(cfg, e, "hidden_size_per_layer_input", 0);
    m.V = (int)cfg_num(cfg, e, "vocab_size", 0);
    m.window = (int)cfg_num(cfg, e, "sliding_window", 512);
    m.eps = cfg_num(cfg, e, "rms_norm_eps", 1e-6);
    m.cap = cfg_num(cfg, e, "final_logit_softcapping", 0);
    if (m.D <= 0 || m.D > 8192 || m.L <= 0 || m.L > MAXL || H <= 0 || m.kvh <= 0 || H % m.kvh || m.I <= 0 ||
        m.P <= 0 || m.V <= 0 || m.D > 8192 || m.I > 65536 || m.V > 1 << 20)
        die(2, "config.json: a size out of this engine's range", path);
    if (!(lt = cfg_find(cfg, e, "layer_types"))) die(2, "config.json: no layer_types", path);
    for (i = 0; i < m.L; i++) {
        if (!(lt = strchr(lt, '"')) || lt >= e) die(2, "config.json: layer_types too short", path);
        m.full[i] = !strncmp(lt + 1, "full_attention", 14);
        if (!(lt = strchr(lt + 1, '"'))) die(2, "config.json: layer_types malformed", path);
        lt++;
        m.hd[i] = (int)cfg_num(cfg, e, m.full[i] ? "global_head_dim" : "head_dim", 0);
        if (m.hd[i] <= 0 || m.hd[i] > 512 || m.hd[i] % 2) die(2, "config.json: head_dim out of range", path);
    }
    rp = cfg_find(cfg, e, "rope_parameters");
    for (i = 0; i < 2; i++) {  /* each type's block: up to its closing brace */
        const char *b = rp ? cfg_find(rp, e, i ? "full_attention" : "sliding_attention") : NULL;
        const char *be = b ? strchr(b, '}') : NULL;
        if (!be) die(2, "config.json: rope_parameters without both layer types", path);
        m.theta[i] = cfg_num(b, be, "rope_theta", 10000);
        m.prf[i] = cfg_num(b, be, "partial_rotary_factor", 1);
    }
    if ((q = cfg_find(cfg, e, "quantization")) != NULL) {
        const char *mode = cfg_find(q, e, "mode");
        qbits = (int)cfg_num(q, e, "bits", 0);
        qgroup = (int)cfg_num(q, e, "group_size", 0);
        if (mode) sscanf(mode, " \"%15[a-z0-9]\"", qmode);
        if ((qbits != 4 && qbits != 8) || qgroup <= 0 || (strcmp(qmode, "affine") && strcmp(qmode, "mxfp4")))
            die(2, "config.json: quantization other than affine 4/8-bit or mxfp4", path);
    }
    free(cfg);
    snprintf(path, sizeof path, "%s/model.safetensors", model_dir);
    if ((e = st_open(&sf, path)) != NULL) die(2, path, e);
    arena_cap = (size_t)64 << 20;
    if (!(arena = (float *)malloc(arena_cap * sizeof(float)))) die(2, "out of memory", NULL);
    m.emb = take("model.embed_tokens", m.V, m.D);
    m.ple_emb = take("model.embed_tokens_per_layer", m.V, (size_t)m.L * m.P);
    m.ple_proj = take("model.per_layer_model_projection", (size_t)m.L * m.P, m.D);
    m.ple_norm = take("model.per_layer_projection_norm", 1, m.P);
    m.norm = take("model.norm", 1, m.D);
    for (i = 0; i < m.L; i++) {
        size_t hd = m.hd[i], D = m.D;
        m.l[i].in_norm = layer_w(i, "input_layernorm", 1, D);
        m.l[i].q = layer_w(i, "self_attn.q_proj", H * hd, D);
        m.l[i].k = layer_w(i, "self_attn.k_proj", m.kvh * hd, D);
        m.l[i].v = layer_w(i, "self_attn.v_proj", m.kvh * hd, D);
        m.l[i].o = layer_w(i, "self_attn.o_proj", D, H * hd);
        m.l[i].q_norm = layer_w(i, "self_attn.q_norm", 1, hd);
        m.l[i].k_norm = layer_w(i, "self_attn.k_norm", 1, hd);
        m.l[i].post_att = layer_w(i, "post_attention_layernorm", 1, D);
        m.l[i].pre_ffn = layer_w(i, "pre_feedforward_layernorm", 1, D);
        m.l[i].gate = layer_w(i, "mlp.gate_proj", m.I, D);
        m.l[i].up = layer_w(i, "mlp.up_proj", m.I, D);
        m.l[i].down = layer_w(i, "mlp.down_proj", D, m.I);
        m.l[i].post_ffn = layer_w(i, "post_feedforward_layernorm", 1, D);
        m.l[i].pl_gate = layer_w(i, "per_layer_input_gate", m.P, D);
        m.l[i].pl_proj = layer_w(i, "per_layer_projection", D, m.P);
        m.l[i].pl_norm = layer_w(i, "post_per_layer_input_norm", 1, D);
        m.l[i].scalar = layer_w(i, "layer_scalar", 1, 1);
    }
    if (missing) {
        fprintf(stderr, "engine: %d tensor(s) missing: the checkpoint is incomplete, re-download it\n", missing);
        exit(3);
    }
}

/* ---- buffers, the schedule and the dump: every op is one recorded dispatch */
typedef struct { const char *id; float *p; size_t cap; const char *label; } Buf;
static wbt_sched *sch;
static wbt_dump *dmp;
static int64_t cb;
static int T;
static char labels[4096][48];
static int nlabels;

static void check(int rc, const char *what) {
    if (rc != WBT_OK) { fprintf(stderr, "engine: tap: %s: %s\n", what, wbt_strerror(rc)); exit(2); }
}
static void buf(Buf *b, const char *id, size_t n) {
    b->id = id;
    b->cap = n;
    b->label = NULL;
    if (!(b->p = (float *)calloc(n, sizeof(float)))) die(2, "out of memory", NULL);
    check(wbt_sched_buffer(sch, id, n * 4, 0), id);
}
/* one dispatch: reads (a, na elements), (b, nb) and the weight w; writes (o, no elements),
 * labelled `name`; then the output dumped under `name` with shape (d0, d1, d2) */
static void rec(const char *name, const char *kernel, Buf *a, size_t na, Buf *b, size_t nb, const W *w, Buf *o,
                size_t no, int64_t d0, int64_t d1, int64_t d2, int as_f16) {
    wbt_access r[3], wr;
    int64_t shape[3];
    size_t nr = 0;
    char *label = labels[nlabels < 4095 ? nlabels++ : 4095];
    memset(r, 0, sizeof r);
    if (a) { r[nr].arg = "a"; r[nr].buffer = a->id; r[nr].size = na * 4; r[nr].value = a->label; nr++; }
    if (b) { r[nr].arg = "b"; r[nr].buffer = b->id; r[nr].size = nb * 4; r[nr].value = b->label; nr++; }
    if (w) { r[nr].arg = "w"; r[nr].buffer = "weights"; r[nr].offset = w->off * 4; r[nr].size = w->rows * w->cols * 4; nr++; }
    wr.arg = "out";
    wr.buffer = o->id;
    wr.offset = 0;
    wr.size = no * 4;
    wr.value = name;
    check(wbt_sched_dispatch(sch, name, kernel, cb, r, nr, &wr, 1), name);
    snprintf(label, 48, "%s", name);
    o->label = label;
    shape[0] = d0; shape[1] = d1; shape[2] = d2;
    check(wbt_dump_add_f32(dmp, name, as_f16 ? WBT_F16 : WBT_F32, shape, d2 ? 3 : 2, o->p), name);
}

/* ---- the math: float32 values, double accumulation */
static void linear(const float *x, const W *w, float *y) {  /* y[t] = W x[t]; x == y: the alias bug */
    size_t t, j, k;
    for (t = 0; t < (size_t)T; t++)
        for (j = 0; j < w->rows; j++) {
            double acc = 0;
            for (k = 0; k < w->cols; k++) acc += (double)x[t * w->cols + k] * w->p[j * w->cols + k];
            y[t * w->rows + j] = (float)acc;
        }
}
static void rmsnorm(const float *x, const W *w, float *y, size_t rows, size_t n) {  /* w NULL: no weight */
    size_t r, j;
    for (r = 0; r < rows; r++) {
        double ss = 0, inv;
        for (j = 0; j < n; j++) ss += (double)x[r * n + j] * x[r * n + j];
        inv = 1.0 / sqrt(ss / (double)n + m.eps);
        for (j = 0; j < n; j++) y[r * n + j] = (float)(x[r * n + j] * inv * (w ? w->p[j] : 1.0f));
    }
}
static float gelu(float x) {
    double d = x;
    return (float)(0.5 * d * (1 + tanh(0.7978845608028654 * (d + 0.044715 * d * d * d))));
}
static float h16(float x) { return wbt_f16_to_f32(wbt_f32_to_f16(x)); }
static float gelu_half(float x) {  /* a half-precision kernel: every step rounded to float16 */
    float g = h16(x), inner = h16(h16(0.7978846f) * h16(g + h16(h16(0.044715f) * h16(h16(g * g) * g))));
    float ex = h16(expf(h16(2 * inner)));    /* past 11.09: 65504 overflows to inf */
    float th = h16(h16(ex - 1) / h16(ex + 1)); /* inf / inf: NaN */
    return h16(h16(0.5f * g) * h16(1 + th));
}
static void rope(float *x, int heads, int hd, int full) {  /* [T, heads, hd], halves rotated */
    int t, h, i, half = hd / 2, rot = full ? (int)(m.prf[1] * hd) / 2 : half;
    for (t = 0; t < T; t++)
        for (h = 0; h < heads; h++)
            for (i = 0; i < rot; i++) {
                float *v = x + ((size_t)t * heads + h) * hd;
                double ang = t * pow(m.theta[full], -2.0 * i / hd), c = cos(ang), s = sin(ang);
                double a = v[i], b = v[i + half];
                v[i] = (float)(a * c - b * s);
                v[i + half] = (float)(a * s + b * c);
            }
}

static Buf X, Hn, Q, K, V, Qn, Kn, Vn, S, Pr, A, O, G, U, Ac, F, Pl, Pe, Pg, Lg, E;

static void layer(int i) {
    char n[48][64];
    int hd = m.hd[i], H = m.H, kv = m.kvh, rep = H / kv, t, s, h, j;
    size_t TD = (size_t)T * m.D, TQ = (size_t)T * H * hd, TK = (size_t)T * kv * hd, TI = (size_t)T * m.I;
    Buf *out = &O;
    const char *nm[] = {"pre_att_norm", "att_q_proj", "att_k_proj", "att_v_proj", "att_q_norm", "att_k_norm",
                        "att_v_norm", "att_q_rope", "att_k_rope", "att_scores", "att_probs", "att_out", "att_o_proj",
                        "post_att_norm", "att_resid", "pre_ffn_norm", "ffn_gate", "ffn_up", "ffn_act", "ffn_down",
                        "post_ffn_norm", "ffn_resid", "ple_gate", "ple_act", "ple_proj", "ple_norm", "ple_resid", "out"};
    for (j = 0; j < 28; j++) snprintf(n[j], sizeof n[j], "blk%d.%s", i, nm[j]);
    if (!(bug == BUG_REUSE_CB && i == 2)) cb = wbt_sched_begin(sch);  /* the bug: layer 1's, committed */
    rmsnorm(X.p, &m.l[i].in_norm, Hn.p, T, m.D);
    rec(n[0], "rms_norm", &X, TD, NULL, 0, &m.l[i].in_norm, &Hn, TD, T, m.D, 0, 0);
    linear(Hn.p, &m.l[i].q, Q.p);
    rec(n[1], "matmul", &Hn, TD, NULL, 0, &m.l[i].q, &Q, TQ, T, H * hd, 0, 0);
    linear(Hn.p, &m.l[i].k, K.p);
    rec(n[2], "matmul", &Hn, TD, NULL, 0, &m.l[i].k, &K, TK, T, kv * hd, 0, 0);
    linear(Hn.p, &m.l[i].v, V.p);
    rec(n[3], "matmul", &Hn, TD, NULL, 0, &m.l[i].v, &V, TK, T, kv * hd, 0, 0);
    rmsnorm(Q.p, &m.l[i].q_norm, Qn.p, (size_t)T * H, hd);
    rec(n[4], "rms_norm", &Q, TQ, NULL, 0, &m.l[i].q_norm, &Qn, TQ, T, H, hd, 0);
    rmsnorm(K.p, &m.l[i].k_norm, Kn.p, (size_t)T * kv, hd);
    rec(n[5], "rms_norm", &K, TK, NULL, 0, &m.l[i].k_norm, &Kn, TK, T, kv, hd, 0);
    rmsnorm(V.p, NULL, Vn.p, (size_t)T * kv, hd);
    rec(n[6], "rms_norm", &V, TK, NULL, 0, NULL, &Vn, TK, T, kv, hd, 0);
    rope(Qn.p, H, hd, m.full[i]);
    rec(n[7], "rope", &Qn, TQ, NULL, 0, NULL, &Qn, TQ, T, H, hd, 0);
    rope(Kn.p, kv, hd, m.full[i]);
    rec(n[8], "rope", &Kn, TK, NULL, 0, NULL, &Kn, TK, T, kv, hd, 0);
    for (h = 0; h < H; h++)  /* scores [H, T, T], scale 1.0, causal (and the window) */
        for (t = 0; t < T; t++) {
            double mx = -INFINITY, sum = 0;
            for (s = 0; s < T; s++) {
                float *sc = &S.p[((size_t)h * T + t) * T + s];
                double acc = 0;
                for (j = 0; j < hd; j++)
                    acc += (double)Qn.p[((size_t)t * H + h) * hd + j] * Kn.p[((size_t)s * kv + h / rep) * hd + j];
                *sc = (s <= t && (m.full[i] || t - s < m.window)) ? (float)acc : -3.4028234663852886e38f;
                if (*sc > mx) mx = *sc;
            }
            for (s = 0; s < T; s++) sum += exp((double)S.p[((size_t)h * T + t) * T + s] - mx);
            for (s = 0; s < T; s++)
                Pr.p[((size_t)h * T + t) * T + s] = (float)(exp((double)S.p[((size_t)h * T + t) * T + s] - mx) / sum);
        }
    rec(n[9], "scores", &Qn, TQ, &Kn, TK, NULL, &S, (size_t)H * T * T, H, T, T, 0);
    rec(n[10], "softmax", &S, (size_t)H * T * T, NULL, 0, NULL, &Pr, (size_t)H * T * T, H, T, T, 0);
    for (t = 0; t < T; t++)
        for (h = 0; h < H; h++)
            for (j = 0; j < hd; j++) {
                double acc = 0;
                for (s = 0; s < T; s++)
                    acc += (double)Pr.p[((size_t)h * T + t) * T + s] * Vn.p[((size_t)s * kv + h / rep) * hd + j];
                A.p[((size_t)t * H + h) * hd + j] = (float)acc;
            }
    rec(n[11], "attend", &Pr, (size_t)H * T * T, &Vn, TK, NULL, &A, TQ, T, H * hd, 0, 0);
    if (bug == BUG_ALIAS && i == 1) out = &A;  /* the seed's bug: o_proj's output over its input */
    linear(A.p, &m.l[i].o, out->p);
    rec(n[12], "matmul", &A, TQ, NULL, 0, &m.l[i].o, out, TD, T, m.D, 0, 0);
    rmsnorm(out->p, &m.l[i].post_att, F.p, T, m.D);
    rec(n[13], "rms_norm", out, TD, NULL, 0, &m.l[i].post_att, &F, TD, T, m.D, 0, 0);
    for (j = 0; j < (int)TD; j++) X.p[j] += F.p[j];
    rec(n[14], "add", &X, TD, &F, TD, NULL, &X, TD, T, m.D, 0, 0);
    rmsnorm(X.p, &m.l[i].pre_ffn, Hn.p, T, m.D);
    rec(n[15], "rms_norm", &X, TD, NULL, 0, &m.l[i].pre_ffn, &Hn, TD, T, m.D, 0, 0);
    linear(Hn.p, &m.l[i].gate, G.p);
    rec(n[16], "matmul", &Hn, TD, NULL, 0, &m.l[i].gate, &G, TI, T, m.I, 0, 0);
    linear(Hn.p, &m.l[i].up, U.p);
    rec(n[17], "matmul", &Hn, TD, NULL, 0, &m.l[i].up, &U, TI, T, m.I, 0, 0);
    for (j = 0; j < (int)TI; j++)  /* the f16 bug: layer 2's GeGLU in half precision */
        Ac.p[j] = (bug == BUG_F16 && i == 2) ? h16(gelu_half(G.p[j]) * h16(U.p[j])) : gelu(G.p[j]) * U.p[j];
    rec(n[18], "geglu", &G, TI, &U, TI, NULL, &Ac, TI, T, m.I, 0, bug == BUG_F16 && i == 2);
    linear(Ac.p, &m.l[i].down, O.p);
    rec(n[19], "matmul", &Ac, TI, NULL, 0, &m.l[i].down, &O, TD, T, m.D, 0, 0);
    rmsnorm(O.p, &m.l[i].post_ffn, F.p, T, m.D);
    rec(n[20], "rms_norm", &O, TD, NULL, 0, &m.l[i].post_ffn, &F, TD, T, m.D, 0, 0);
    for (j = 0; j < (int)TD; j++) X.p[j] += F.p[j];
    rec(n[21], "add", &X, TD, &F, TD, NULL, &X, TD, T, m.D, 0, 0);
    linear(X.p, &m.l[i].pl_gate, Pg.p);
    rec(n[22], "matmul", &X, TD, NULL, 0, &m.l[i].pl_gate, &Pg, (size_t)T * m.P, T, m.P, 0, 0);
    for (t = 0; t < T; t++)
        for (j = 0; j < m.P; j++)
            Pe.p[(size_t)t * m.P + j] = gelu(Pg.p[(size_t)t * m.P + j]) * Pl.p[((size_t)t * m.L + i) * m.P + j];
    rec(n[23], "geglu", &Pg, (size_t)T * m.P, &Pl, (size_t)T * m.L * m.P, NULL, &Pe, (size_t)T * m.P, T, m.P, 0, 0);
    linear(Pe.p, &m.l[i].pl_proj, O.p);
    rec(n[24], "matmul", &Pe, (size_t)T * m.P, NULL, 0, &m.l[i].pl_proj, &O, TD, T, m.D, 0, 0);
    rmsnorm(O.p, &m.l[i].pl_norm, F.p, T, m.D);
    rec(n[25], "rms_norm", &O, TD, NULL, 0, &m.l[i].pl_norm, &F, TD, T, m.D, 0, 0);
    for (j = 0; j < (int)TD; j++) X.p[j] += F.p[j];
    rec(n[26], "add", &X, TD, &F, TD, NULL, &X, TD, T, m.D, 0, 0);
    for (j = 0; j < (int)TD; j++) X.p[j] *= m.l[i].scalar.p[0];
    rec(n[27], "scale", &X, TD, NULL, 0, &m.l[i].scalar, &X, TD, T, m.D, 0, 0);
    check(wbt_sched_commit(sch, cb), "commit");
    check(wbt_sched_complete(sch, cb), "complete");
}

static void forward(const int *ids) {
    size_t D = m.D, LP = (size_t)m.L * m.P, t, j;
    int i;
    for (t = 0; t < (size_t)T; t++)
        for (j = 0; j < D; j++) E.p[t * D + j] = m.emb.p[(size_t)ids[t] * D + j];
    cb = wbt_sched_begin(sch);
    rec("tok_emb", "gather", NULL, 0, NULL, 0, &m.emb, &E, T * D, T, m.D, 0, 0);
    for (j = 0; j < T * D; j++) X.p[j] = E.p[j] * sqrtf((float)m.D);
    rec("tok_emb_scaled", "scale", &E, T * D, NULL, 0, NULL, &X, T * D, T, m.D, 0, 0);
    for (t = 0; t < (size_t)T; t++)
        for (j = 0; j < LP; j++) Pl.p[t * LP + j] = m.ple_emb.p[(size_t)ids[t] * LP + j] * sqrtf((float)m.P);
    rec("ple_emb_scaled", "gather", NULL, 0, NULL, 0, &m.ple_emb, &Pl, T * LP, T, m.L, m.P, 0);
    linear(X.p, &m.ple_proj, Lg.p);
    rec("ple_proj", "matmul", &X, T * D, NULL, 0, &m.ple_proj, &Lg, T * LP, T, (int64_t)LP, 0, 0);
    for (j = 0; j < T * LP; j++) Lg.p[j] *= (float)(1.0 / sqrt((double)m.D));
    rmsnorm(Lg.p, &m.ple_norm, Lg.p, T * m.L, m.P);
    rec("ple_proj_norm", "rms_norm", &Lg, T * LP, NULL, 0, &m.ple_norm, &Lg, T * LP, T, m.L, m.P, 0);
    for (j = 0; j < T * LP; j++) Pl.p[j] = (Lg.p[j] + Pl.p[j]) * (float)(1.0 / sqrt(2.0));
    rec("ple_inputs", "add", &Pl, T * LP, &Lg, T * LP, NULL, &Pl, T * LP, T, m.L, m.P, 0);
    check(wbt_sched_commit(sch, cb), "commit");
    check(wbt_sched_complete(sch, cb), "complete");
    for (i = 0; i < m.L; i++) layer(i);
    cb = wbt_sched_begin(sch);
    rmsnorm(X.p, &m.norm, Hn.p, T, m.D);
    rec("final_norm", "rms_norm", &X, T * D, NULL, 0, &m.norm, &Hn, T * D, T, m.D, 0, 0);
    linear(Hn.p, &m.emb, Lg.p);  /* tied: the embeddings as the head */
    rec("out_proj", "matmul", &Hn, T * D, NULL, 0, &m.emb, &Lg, (size_t)T * m.V, T, m.V, 0, 0);
    for (j = 0; j < (size_t)T * m.V; j++) Lg.p[j] = m.cap > 0 ? (float)(tanh(Lg.p[j] / m.cap) * m.cap) : Lg.p[j];
    rec("out_logits", "softcap", &Lg, (size_t)T * m.V, NULL, 0, NULL, &Lg, (size_t)T * m.V, T, m.V, 0, 0);
    check(wbt_sched_commit(sch, cb), "commit");
    check(wbt_sched_complete(sch, cb), "complete");
}

int main(int argc, char **argv) {
    const char *ids_arg = NULL, *dump = NULL, *sched = NULL, *bugs[] = {"", "alias", "reuse-cb", "loader-name",
                                                                      "mxfp4-affine", "f16-overflow"};
    int ids[MAXT], i, k;
    int64_t ids64[MAXT];
    size_t TD, TQ, TK, big;
    for (i = 1; i < argc; i++) {
        const char **slot = !strcmp(argv[i], "--ids") ? &ids_arg : !strcmp(argv[i], "--dump") ? &dump
                          : !strcmp(argv[i], "--schedule") ? &sched : NULL;
        if (slot && i + 1 < argc) { *slot = argv[++i]; continue; }
        if (!strcmp(argv[i], "--dump-weights")) { dump_weights = 1; continue; }
        if (!strcmp(argv[i], "--bug") && i + 1 < argc) {
            for (k = 1; k < 6 && strcmp(argv[i + 1], bugs[k]); k++) {}
            if (k == 6) die(2, "unknown --bug (alias, reuse-cb, loader-name, mxfp4-affine, f16-overflow)", argv[i + 1]);
            bug = k;
            i++;
            continue;
        }
        if (argv[i][0] == '-' || model_dir) die(2, "usage", USAGE);
        model_dir = argv[i];
    }
    if (!model_dir || !ids_arg || !dump || !sched) die(2, "usage", USAGE);
    load();
    for (T = 0; *ids_arg; T++) {
        char *stop;
        long v = strtol(ids_arg, &stop, 10);
        if (T >= MAXT || stop == ids_arg || v < 0 || v >= m.V || (*stop && *stop != ',')) die(2, "--ids: token ids below the vocabulary, comma-separated", ids_arg);
        ids[T] = (int)v;
        ids64[T] = v;
        ids_arg = *stop ? stop + 1 : stop;
    }
    if (!T) die(2, "--ids: no token ids", NULL);
    check(wbt_dump_open(&dmp, dump), dump);
    check(wbt_sched_open(&sch, sched, 0), sched);
    check(wbt_sched_buffer(sch, "weights", arena_n * 4, 1), "weights");
    check(wbt_sched_inplace(sch, "add", "a", "out"), "add");
    check(wbt_sched_inplace(sch, "scale", "a", "out"), "scale");
    check(wbt_sched_inplace(sch, "rope", "a", "out"), "rope");
    check(wbt_sched_inplace(sch, "rms_norm", "a", "out"), "rms_norm");  /* (PLE's, per row in place) */
    check(wbt_sched_inplace(sch, "softcap", "a", "out"), "softcap");
    TD = (size_t)T * m.D;
    TQ = (size_t)T * m.H * 512;
    TK = (size_t)T * m.kvh * 512;
    big = (size_t)T * (m.V > m.L * m.P ? m.V : m.L * m.P);
    buf(&E, "emb", TD); buf(&X, "x", TD); buf(&Hn, "h", TD); buf(&Q, "q", TQ); buf(&K, "k", TK); buf(&V, "v", TK);
    buf(&Qn, "qn", TQ); buf(&Kn, "kn", TK); buf(&Vn, "vn", TK); buf(&S, "scores", (size_t)m.H * T * T);
    buf(&Pr, "probs", (size_t)m.H * T * T); buf(&A, "attnH", TQ); buf(&O, "o", TD); buf(&F, "f", TD);
    buf(&G, "g", (size_t)T * m.I); buf(&U, "u", (size_t)T * m.I); buf(&Ac, "act", (size_t)T * m.I);
    buf(&Pl, "ple", (size_t)T * m.L * m.P); buf(&Pe, "ple_act", (size_t)T * m.P); buf(&Pg, "ple_gate", (size_t)T * m.P);
    buf(&Lg, "wide", big);
    forward(ids);
    for (i = 0; dump_weights && i < nloaded; i++) {  /* as dequantized: w.layers.0.mlp.up_proj */
        int64_t shape[2];
        shape[0] = (int64_t)loaded[i].w.rows;
        shape[1] = (int64_t)loaded[i].w.cols;
        check(wbt_dump_add_f32(dmp, loaded[i].name, WBT_F32, shape, 2, loaded[i].w.p), loaded[i].name);
    }
    check(wbt_dump_precision(dmp, "float32"), "precision");
    check(wbt_dump_ids(dmp, ids64, (size_t)T), "ids");
    check(wbt_dump_positions(dmp, NULL, 0, 0), "positions");
    check(wbt_dump_meta(dmp, "workbench.engine", "engine_c"), "engine");
    check(wbt_dump_close(dmp), dump);
    check(wbt_sched_close(sch), sched);
    return 0;
}
