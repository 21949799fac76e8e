/* The tap's own checks (tests/test_c_engine.py), compiled with WBT_MAX_TENSORS=4:
 *
 *   tap_check DIR   writes DIR/dtypes.safetensors (F16 / BF16 / F32 of the same edge-case
 *                   values, read back by workbench's reader and checked against MLX's casts),
 *                   DIR/alias.schedule.json (one aliased dispatch, one reused command buffer)
 *                   and prints one "name=code" line per refused call (hostile inputs). */
#define WORKBENCH_TAP_IMPLEMENTATION
#include "workbench_tap.h"
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const float cases[] = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 65519.0f, 65520.0f, 1e5f, -1e5f, 6e-8f, 3e-8f,
                              2.98e-8f, 1e-5f, 6.1e-5f, 0.1f, 1.0009765625f, 1.00048828125f, 1.00146484375f,
                              3.3895313892515355e38f, FLT_MAX, 1e-40f, 123.456f, 1.0f / 3.0f, 2048.5f};
#define NC (sizeof cases / sizeof cases[0])

static void say(const char *what, int rc) { printf("%s=%d\n", what, rc); }

int main(int argc, char **argv) {
    char path[1024], link_path[1024], name[WBT_MAX_NAME + 2];
    float v[NC + 2];
    int64_t shape[1] = {(int64_t)(NC + 2)}, big[2] = {(int64_t)1 << 40, (int64_t)1 << 40};
    wbt_dump *d;
    wbt_sched *s;
    wbt_access r, w;
    int64_t cb;
    if (argc != 2) return 2;
    memcpy(v, cases, sizeof cases);
    v[NC] = (float)INFINITY;
    v[NC + 1] = (float)NAN;

    /* a dump of every dtype, with metadata */
    snprintf(path, sizeof path, "%s/dtypes.safetensors", argv[1]);
    if (wbt_dump_open(&d, path)) return 1;
    if (wbt_dump_add_f32(d, "x.f32", WBT_F32, shape, 1, v) || wbt_dump_add_f32(d, "x.f16", WBT_F16, shape, 1, v) ||
        wbt_dump_add_f32(d, "x.bf16", WBT_BF16, shape, 1, v) || wbt_dump_precision(d, "float16") ||
        wbt_dump_positions(d, NULL, 0, 1))
        return 1;
    say("too_big", wbt_dump_add(d, "huge", WBT_F32, big, 2, v));
    say("bad_dtype", wbt_dump_add(d, "odd", (wbt_dtype)7, shape, 1, v));
    memset(name, 'a', WBT_MAX_NAME + 1);
    name[WBT_MAX_NAME + 1] = 0;
    say("long_name", wbt_dump_add_f32(d, name, WBT_F32, shape, 1, v));
    name[WBT_MAX_NAME] = 0;  /* exactly the cap: taken */
    say("cap_name", wbt_dump_add_f32(d, name, WBT_F32, shape, 1, v));
    say("too_many", wbt_dump_add_f32(d, "fifth", WBT_F32, shape, 1, v));
    say("control_char", wbt_dump_meta(d, "bad\nkey", "v"));
    say("duplicate_key", wbt_dump_precision(d, "float32"));
    say("bad_precision", wbt_dump_precision(d, "float8"));
    say("dump_close", wbt_dump_close(d));

    /* a duplicate tensor name */
    snprintf(path, sizeof path, "%s/dup.safetensors", argv[1]);
    if (wbt_dump_open(&d, path)) return 1;
    wbt_dump_add_f32(d, "t", WBT_F32, shape, 1, v);
    say("duplicate_tensor", wbt_dump_add_f32(d, "t", WBT_F32, shape, 1, v));
    wbt_dump_discard(d);

    /* a symlink at the destination: refused, never followed */
    snprintf(path, sizeof path, "%s/target.txt", argv[1]);
    snprintf(link_path, sizeof link_path, "%s/link.safetensors", argv[1]);
    say("symlink_open", wbt_dump_open(&d, link_path));
    snprintf(link_path, sizeof link_path, "%s/link.schedule.json", argv[1]);
    say("symlink_sched", wbt_sched_open(&s, link_path, 0));

    /* a schedule with the seed's two bugs: o_proj over its own input, a reused command buffer */
    snprintf(path, sizeof path, "%s/alias.schedule.json", argv[1]);
    if (wbt_sched_open(&s, path, 1) || wbt_sched_buffer(s, "x", 4096, 1) || wbt_sched_buffer(s, "attnH", 4096, 0) ||
        wbt_sched_inplace(s, "add", "a", "out"))
        return 1;
    cb = wbt_sched_begin(s);
    r.arg = "x"; r.buffer = "x"; r.offset = 0; r.size = 4096; r.value = NULL;
    w.arg = "out"; w.buffer = "attnH"; w.offset = 0; w.size = 4096; w.value = "attn";
    if (wbt_sched_dispatch(s, "attn", "sdpa", cb, &r, 1, &w, 1) || wbt_sched_barrier(s)) return 1;
    r.buffer = "attnH"; r.value = "attn"; w.value = "o_proj";
    if (wbt_sched_dispatch(s, "o_proj", "matmul", cb, &r, 1, &w, 1) || wbt_sched_commit(s, cb)) return 1;
    r.buffer = "nope";
    say("unknown_buffer", wbt_sched_dispatch(s, "lost", "matmul", cb, &r, 1, &w, 1));
    r.buffer = "attnH"; r.value = "o_proj"; w.buffer = "x"; w.value = "late";
    if (wbt_sched_dispatch(s, "late", "matmul", cb, &r, 1, &w, 1) || wbt_sched_complete(s, cb)) return 1;
    if (wbt_sched_alloc(s, "tmp", 64, 0) || wbt_sched_free(s, "tmp")) return 1;
    say("sched_close", wbt_sched_close(s));
    return 0;
}
