/* A stand-in for ROCm's libhipblaslt.so, for qbackend's CPU tests (no ROCm, no GPU).
 *
 * It exports the hipBLASLt C functions the hipblaslt provider calls, with the signatures of
 * hipblaslt.h, and checks their arguments the way the library's documentation and sources state
 * (attribute ids valid for the version it pretends to be, attribute buffer sizes, hipDataType
 * values, ld >= rows, scale pointer and scale mode combinations, the workspace an algorithm needs,
 * algorithms used only for the problem they were found for). Every call is written to a log that
 * the tests read. hipblasLtMatmul computes the GEMM on the CPU: "device" pointers are host
 * pointers here (torch CPU tensors).
 *
 * It pretends to be one hipBLASLt version at a time (standin_set_version, or the environment
 * variable HIPBLASLT_STANDIN_VERSION, as major * 100000 + minor * 100 + patch, the encoding of
 * hipblasLtGetVersion) and one GPU arch (standin_set_arch). The version decides which attribute ids
 * exist and what they mean:
 *   before 0.10 (ROCm 6.0-6.2): scalar scales only, no OCP fp8 data types;
 *   0.10 to 0.12 (ROCm 6.3-6.4): 102 / 103 are A / B_SCALE_POINTER_VEC_EXT (a vector of scales);
 *   1.0 (ROCm 7.0): 102 / 103 do not exist; 31 / 32 are A / B_SCALE_MODE (3: OUTER_VEC_32F);
 *   1.1 and later: 102 / 103 are EPILOGUE_ACT_ARG0 / ARG1_EXT (floats).
 * It is stricter than the library in one way: attribute buffers must have exactly the documented
 * size (the library accepts larger ones).
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int hipblasStatus_t;
enum {
    ST_SUCCESS = 0, ST_NOT_INITIALIZED = 1, ST_INVALID_VALUE = 3, ST_NOT_SUPPORTED = 7,
};

#define V(major, minor) ((major) * 100000 + (minor) * 100)

/* hipDataType values (HIP's library_types.h) */
enum { R_32F = 0, R_16F = 2, R_16BF = 14, R_8F_E4M3 = 28, R_8F_E5M2 = 29,
       R_8F_E4M3_FNUZ = 1000, R_8F_E5M2_FNUZ = 1001 };
enum { OP_N = 111, OP_T = 112, OP_C = 113 };
enum { COMPUTE_32F = 2 };
enum { EPILOGUE_DEFAULT = 1, EPILOGUE_BIAS = 4 };
enum { SCALE_SCALAR_32F = 0, SCALE_OUTER_VEC_32F = 3 };

/* What the heuristic does (standin_set_heuristic). */
enum { HEUR_NORMAL = 0, HEUR_NONE = 1, HEUR_BAD_STATE = 2, HEUR_IGNORE_LIMIT = 3 };

/* ---------------------------------------------------------------------------- state and log */

static int g_version = -1;
static char g_arch[32] = "gfx942";
static int g_heuristic = HEUR_NORMAL;
static uint64_t g_workspace_need = 4096;
static char *g_log;
static size_t g_log_len, g_log_cap;
static long g_next_id = 1;

enum { K_HANDLE, K_DESC, K_LAYOUT, K_PREF, K_COUNT };
static long g_live[K_COUNT];
static const char *KIND_NAME[K_COUNT] = {"handle", "desc", "layout", "pref"};

static int version(void) {
    if (g_version < 0) {
        const char *env = getenv("HIPBLASLT_STANDIN_VERSION");
        g_version = env ? atoi(env) : V(1, 2);
    }
    return g_version;
}

static void logf_(const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n >= sizeof line) n = sizeof line - 1;
    if (g_log_len + n + 2 > g_log_cap) {
        size_t cap = g_log_cap ? g_log_cap * 2 : 1 << 16;
        while (cap < g_log_len + n + 2) cap *= 2;
        char *grown = realloc(g_log, cap);
        if (!grown) return;
        g_log = grown;
        g_log_cap = cap;
    }
    memcpy(g_log + g_log_len, line, n);
    g_log_len += n;
    g_log[g_log_len++] = '\n';
    g_log[g_log_len] = 0;
}

/* A failed call: logs the reason and returns the status. */
static hipblasStatus_t fail(const char *fn, hipblasStatus_t status, const char *fmt, ...) {
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    logf_("%s status=%d why=%s", fn, status, why);
    return status;
}

/* ---------------------------------------------------------------------------- objects */

#define MAGIC 0x51b1a5u

/* Every object starts with this. Destroyed objects are kept (marked dead), so that a use after
 * destruction is reported instead of reading freed memory. */
typedef struct { uint32_t magic; int kind; long id; int live; } Obj;

typedef struct { Obj h; } Handle;

typedef struct {
    Obj h;
    int compute, scale_type;
    int32_t op[2];                /* TRANSA, TRANSB */
    uint32_t epilogue;
    const void *bias;
    int32_t bias_type;            /* -1: not set (the D type) */
    const void *scale[2];         /* A, B */
    int scale_vec[2];             /* set through *_SCALE_POINTER_VEC_EXT */
    int32_t scale_mode[2];        /* *_SCALE_MODE */
    int32_t input_type[2];        /* COMPUTE_INPUT_TYPE_A/B_EXT, -1: not set */
    float act_arg[2];
    int unimplemented;            /* an attribute this stand-in does not compute was set, else -1 */
} Desc;

typedef struct { Obj h; int type; uint64_t rows, cols; int64_t ld; } Layout;
typedef struct { Obj h; uint64_t max_workspace; uint32_t search_mode; } Pref;

/* The public structs, as hipblaslt.h declares them. */
typedef struct { uint8_t data[16]; size_t max_workspace_bytes; } hipblasLtMatmulAlgo_t;
typedef struct {
    hipblasLtMatmulAlgo_t algo;
    size_t workspaceSize;
    hipblasStatus_t state;
    float wavesCount;
    int reserved[4];
} hipblasLtMatmulHeuristicResult_t;

static void *new_obj(size_t size, int kind) {
    Obj *o = calloc(1, size);
    if (!o) return NULL;
    o->magic = MAGIC;
    o->kind = kind;
    o->id = g_next_id++;
    o->live = 1;
    g_live[kind]++;
    return o;
}

/* NULL when p is a live object of that kind, else what is wrong with it. */
static const char *bad_obj(const void *p, int kind) {
    const Obj *o = p;
    if (!o) return "NULL";
    if (o->magic != MAGIC || o->kind != kind) return "not an object of this kind";
    if (!o->live) return "already destroyed";
    return NULL;
}

static hipblasStatus_t destroy(const char *fn, void *p, int kind) {
    const char *bad = bad_obj(p, kind);
    if (bad) return fail(fn, ST_INVALID_VALUE, "%s: %s", KIND_NAME[kind], bad);
    Obj *o = p;
    o->live = 0;
    g_live[kind]--;
    logf_("%s id=%ld status=0", fn, o->id);
    return ST_SUCCESS;
}

/* ---------------------------------------------------------------------------- enums by version */

static int valid_datatype(int t) {
    int v = version();
    if ((t >= 0 && t <= 27) || t == R_8F_E4M3_FNUZ || t == R_8F_E5M2_FNUZ) return 1;
    if ((t == R_8F_E4M3 || t == R_8F_E5M2) && v >= V(0, 10)) return 1;
    if (t >= 30 && t <= 33 && v >= V(1, 0)) return 1;
    return 0;
}

static int valid_compute(int c) {
    return (c >= 0 && c <= 10) || (c >= 100 && c <= 103 && version() >= V(1, 0));
}

enum { T_I32, T_U32, T_U64, T_I64, T_PTR, T_F32 };
static const size_t TYPE_SIZE[] = {4, 4, 8, 8, sizeof(void *), 4};

typedef struct { const char *name; int type; } Attr;

/* hipblasLtMatmulDescAttributes_t of the pretended version: name and documented data type, or
 * NULL when the id does not exist there. */
static const Attr *desc_attr(int id) {
    static const Attr common[] = {
        {"TRANSA", T_I32}, {"TRANSB", T_I32}, {"EPILOGUE", T_U32}, {"BIAS_POINTER", T_PTR},
        {"BIAS_DATA_TYPE", T_I32}, {"A_SCALE_POINTER", T_PTR}, {"B_SCALE_POINTER", T_PTR},
        {"C_SCALE_POINTER", T_PTR}, {"D_SCALE_POINTER", T_PTR}, {"EPILOGUE_AUX_SCALE_POINTER", T_PTR},
        {"EPILOGUE_AUX_POINTER", T_PTR}, {"EPILOGUE_AUX_LD", T_I64}, {"EPILOGUE_AUX_BATCH_STRIDE", T_I64},
        {"POINTER_MODE", T_I32},
    };
    static const Attr amax = {"AMAX_D_POINTER", T_PTR};
    static const Attr input_type[] = {{"COMPUTE_INPUT_TYPE_A_EXT", T_I32}, {"COMPUTE_INPUT_TYPE_B_EXT", T_I32}};
    static const Attr vec_ext[] = {{"A_SCALE_POINTER_VEC_EXT", T_PTR}, {"B_SCALE_POINTER_VEC_EXT", T_PTR}};
    static const Attr aux_type = {"EPILOGUE_AUX_DATA_TYPE", T_I32};
    static const Attr scale_mode[] = {{"A_SCALE_MODE", T_I32}, {"B_SCALE_MODE", T_I32}};
    static const Attr act_arg[] = {{"EPILOGUE_ACT_ARG0_EXT", T_F32}, {"EPILOGUE_ACT_ARG1_EXT", T_F32}};
    int v = version();
    if (id >= 0 && id <= 13) return &common[id];
    if (id == 14 && v >= V(0, 8)) return &amax;
    if ((id == 100 || id == 101) && v >= V(0, 8)) return &input_type[id - 100];
    if ((id == 102 || id == 103) && v >= V(0, 10) && v < V(1, 0)) return &vec_ext[id - 102];
    if ((id == 102 || id == 103) && v >= V(1, 1)) return &act_arg[id - 102];
    if (id == 22 && v >= V(1, 0)) return &aux_type;
    if ((id == 31 || id == 32) && v >= V(1, 0)) return &scale_mode[id - 31];
    return NULL;
}

/* ---------------------------------------------------------------------------- library API */

hipblasStatus_t hipblasLtCreate(void **handle) {
    if (!handle) return fail("hipblasLtCreate", ST_INVALID_VALUE, "handle is NULL");
    Handle *h = new_obj(sizeof(Handle), K_HANDLE);
    *handle = h;
    logf_("hipblasLtCreate id=%ld status=0", h->h.id);
    return ST_SUCCESS;
}

hipblasStatus_t hipblasLtDestroy(void *handle) { return destroy("hipblasLtDestroy", handle, K_HANDLE); }

hipblasStatus_t hipblasLtGetVersion(void *handle, int *out) {
    if (bad_obj(handle, K_HANDLE)) return fail("hipblasLtGetVersion", ST_NOT_INITIALIZED, "no valid handle");
    if (!out) return fail("hipblasLtGetVersion", ST_INVALID_VALUE, "version is NULL");
    *out = version();
    logf_("hipblasLtGetVersion version=%d status=0", *out);
    return ST_SUCCESS;
}

hipblasStatus_t hipblasLtGetGitRevision(void *handle, char *rev) {
    if (bad_obj(handle, K_HANDLE)) return fail("hipblasLtGetGitRevision", ST_NOT_INITIALIZED, "no valid handle");
    if (!rev) return fail("hipblasLtGetGitRevision", ST_INVALID_VALUE, "rev is NULL");
    snprintf(rev, 64, "standin-%d", version());
    logf_("hipblasLtGetGitRevision status=0");
    return ST_SUCCESS;
}

hipblasStatus_t hipblasLtMatrixLayoutCreate(void **layout, int type, uint64_t rows, uint64_t cols, int64_t ld) {
    const char *fn = "hipblasLtMatrixLayoutCreate";
    if (!layout) return fail(fn, ST_INVALID_VALUE, "matLayout is NULL");
    if (!valid_datatype(type)) return fail(fn, ST_INVALID_VALUE, "type %d is no hipDataType of version %d", type, version());
    if (rows == 0 || cols == 0 || rows > INT32_MAX || cols > INT32_MAX)
        return fail(fn, ST_INVALID_VALUE, "rows %llu, cols %llu: must be 1 to 2^31-1",
                    (unsigned long long)rows, (unsigned long long)cols);
    if (ld < 0 || (uint64_t)ld < rows)
        return fail(fn, ST_INVALID_VALUE, "ld %lld < rows %llu (column-major leading dimension)",
                    (long long)ld, (unsigned long long)rows);
    Layout *l = new_obj(sizeof(Layout), K_LAYOUT);
    l->type = type;
    l->rows = rows;
    l->cols = cols;
    l->ld = ld;
    *layout = l;
    logf_("%s id=%ld type=%d rows=%llu cols=%llu ld=%lld status=0", fn, l->h.id, type,
          (unsigned long long)rows, (unsigned long long)cols, (long long)ld);
    return ST_SUCCESS;
}

hipblasStatus_t hipblasLtMatrixLayoutDestroy(void *layout) {
    return destroy("hipblasLtMatrixLayoutDestroy", layout, K_LAYOUT);
}

hipblasStatus_t hipblasLtMatmulDescCreate(void **desc, int compute, int scale_type) {
    const char *fn = "hipblasLtMatmulDescCreate";
    if (!desc) return fail(fn, ST_INVALID_VALUE, "matmulDesc is NULL");
    if (!valid_compute(compute)) return fail(fn, ST_INVALID_VALUE, "computeType %d is not valid", compute);
    if (!valid_datatype(scale_type)) return fail(fn, ST_INVALID_VALUE, "scaleType %d is no hipDataType", scale_type);
    Desc *d = new_obj(sizeof(Desc), K_DESC);
    d->compute = compute;
    d->scale_type = scale_type;
    d->op[0] = d->op[1] = OP_N;
    d->epilogue = EPILOGUE_DEFAULT;
    d->bias_type = -1;
    d->input_type[0] = d->input_type[1] = -1;
    d->unimplemented = -1;
    *desc = d;
    logf_("%s id=%ld compute=%d scale_type=%d status=0", fn, d->h.id, compute, scale_type);
    return ST_SUCCESS;
}

hipblasStatus_t hipblasLtMatmulDescDestroy(void *desc) { return destroy("hipblasLtMatmulDescDestroy", desc, K_DESC); }

hipblasStatus_t hipblasLtMatmulDescSetAttribute(void *desc, int attr, const void *buf, size_t size) {
    const char *fn = "hipblasLtMatmulDescSetAttribute";
    const char *bad = bad_obj(desc, K_DESC);
    if (bad) return fail(fn, ST_INVALID_VALUE, "matmulDesc: %s", bad);
    Desc *d = desc;
    const Attr *a = desc_attr(attr);
    if (!a) return fail(fn, ST_INVALID_VALUE, "attribute %d does not exist in version %d", attr, version());
    if (!buf) return fail(fn, ST_INVALID_VALUE, "buf is NULL");
    if (size != TYPE_SIZE[a->type])
        return fail(fn, ST_INVALID_VALUE, "attribute %d (%s) takes %zu bytes, got %zu", attr, a->name,
                    TYPE_SIZE[a->type], size);
    int32_t i32 = 0;
    const void *ptr = NULL;
    float f32 = 0;
    int64_t i64 = 0;
    if (a->type == T_I32 || a->type == T_U32) memcpy(&i32, buf, 4);
    if (a->type == T_PTR) memcpy(&ptr, buf, sizeof ptr);
    if (a->type == T_F32) memcpy(&f32, buf, 4);
    if (a->type == T_I64) memcpy(&i64, buf, 8);
    switch (attr) {
    case 0: case 1:
        if (i32 != OP_N && i32 != OP_T && i32 != OP_C)
            return fail(fn, ST_INVALID_VALUE, "%s %d is no hipblasOperation_t", a->name, i32);
        d->op[attr] = i32;
        break;
    case 2:
        d->epilogue = (uint32_t)i32;
        if (i32 != EPILOGUE_DEFAULT && i32 != EPILOGUE_BIAS) d->unimplemented = attr;
        break;
    case 3: d->bias = ptr; break;
    case 4:
        if (!valid_datatype(i32)) return fail(fn, ST_INVALID_VALUE, "BIAS_DATA_TYPE %d is no hipDataType", i32);
        d->bias_type = i32;
        break;
    case 5: case 6:          /* the scalar attribute also clears a vector set before (as the library does) */
        d->scale[attr - 5] = ptr;
        d->scale_vec[attr - 5] = 0;
        break;
    case 31: case 32:
        if (i32 < 0 || i32 > 5) return fail(fn, ST_INVALID_VALUE, "%s %d is no hipblasLtMatmulMatrixScale_t", a->name, i32);
        d->scale_mode[attr - 31] = i32;
        break;
    case 100: case 101:
        if (!valid_datatype(i32)) return fail(fn, ST_INVALID_VALUE, "%s %d is no hipDataType", a->name, i32);
        d->input_type[attr - 100] = i32;
        break;
    case 102: case 103:
        if (a->type == T_PTR) {
            d->scale[attr - 102] = ptr;
            d->scale_vec[attr - 102] = 1;
        } else {
            d->act_arg[attr - 102] = f32;
        }
        break;
    case 13:
        if (i32 != 0) d->unimplemented = attr;
        break;
    default:                 /* valid, but nothing qbackend uses: the stand-in does not compute it */
        if (ptr || i32 || i64) d->unimplemented = attr;
    }
    if (a->type == T_PTR)
        logf_("%s desc=%ld attr=%d name=%s size=%zu value=%p status=0", fn, d->h.id, attr, a->name, size, ptr);
    else if (a->type == T_F32)
        logf_("%s desc=%ld attr=%d name=%s size=%zu value=%g status=0", fn, d->h.id, attr, a->name, size, f32);
    else if (a->type == T_I64)
        logf_("%s desc=%ld attr=%d name=%s size=%zu value=%lld status=0", fn, d->h.id, attr, a->name, size, (long long)i64);
    else
        logf_("%s desc=%ld attr=%d name=%s size=%zu value=%d status=0", fn, d->h.id, attr, a->name, size, i32);
    return ST_SUCCESS;
}

hipblasStatus_t hipblasLtMatmulPreferenceCreate(void **pref) {
    if (!pref) return fail("hipblasLtMatmulPreferenceCreate", ST_INVALID_VALUE, "pref is NULL");
    Pref *p = new_obj(sizeof(Pref), K_PREF);
    *pref = p;
    logf_("hipblasLtMatmulPreferenceCreate id=%ld status=0", p->h.id);
    return ST_SUCCESS;
}

hipblasStatus_t hipblasLtMatmulPreferenceDestroy(void *pref) {
    return destroy("hipblasLtMatmulPreferenceDestroy", pref, K_PREF);
}

hipblasStatus_t hipblasLtMatmulPreferenceSetAttribute(void *pref, int attr, const void *buf, size_t size) {
    const char *fn = "hipblasLtMatmulPreferenceSetAttribute";
    const char *bad = bad_obj(pref, K_PREF);
    if (bad) return fail(fn, ST_INVALID_VALUE, "pref: %s", bad);
    if (!buf) return fail(fn, ST_INVALID_VALUE, "buf is NULL");
    Pref *p = pref;
    if (attr == 0) {             /* SEARCH_MODE: uint32_t */
        if (size != 4) return fail(fn, ST_INVALID_VALUE, "SEARCH_MODE takes 4 bytes, got %zu", size);
        memcpy(&p->search_mode, buf, 4);
    } else if (attr == 1) {      /* MAX_WORKSPACE_BYTES: uint64_t */
        if (size != 8) return fail(fn, ST_INVALID_VALUE, "MAX_WORKSPACE_BYTES takes 8 bytes, got %zu", size);
        memcpy(&p->max_workspace, buf, 8);
    } else {
        return fail(fn, ST_INVALID_VALUE, "preference attribute %d does not exist", attr);
    }
    logf_("%s pref=%ld attr=%d size=%zu value=%llu status=0", fn, p->h.id, attr, size,
          (unsigned long long)(attr == 1 ? p->max_workspace : p->search_mode));
    return ST_SUCCESS;
}

/* ---------------------------------------------------------------------------- the problem */

typedef struct {
    int64_t m, n, k;
    int vector;                   /* scales are vectors (A: m values, B: n values) */
} Problem;

static int is_fnuz(int t) { return t == R_8F_E4M3_FNUZ || t == R_8F_E5M2_FNUZ; }
static int is_ocp(int t) { return t == R_8F_E4M3 || t == R_8F_E5M2; }

/* Everything the heuristic and the matmul check: ST_SUCCESS, or the status with *why set.
 * ST_NOT_SUPPORTED means valid but not served (no kernel for it). */
static hipblasStatus_t check_problem(const Desc *d, const Layout *A, const Layout *B, const Layout *C,
                                     const Layout *D, Problem *p, char *why, size_t nwhy) {
    int v = version();
    if (d->compute != COMPUTE_32F || d->scale_type != R_32F) {
        snprintf(why, nwhy, "compute %d / scale type %d: only HIPBLAS_COMPUTE_32F with HIP_R_32F", d->compute, d->scale_type);
        return ST_NOT_SUPPORTED;
    }
    if (d->unimplemented >= 0) {
        snprintf(why, nwhy, "attribute %d is set: the stand-in does not compute it", d->unimplemented);
        return ST_NOT_SUPPORTED;
    }
    int64_t am = d->op[0] == OP_N ? A->rows : A->cols, ak = d->op[0] == OP_N ? A->cols : A->rows;
    int64_t bk = d->op[1] == OP_N ? B->rows : B->cols, bn = d->op[1] == OP_N ? B->cols : B->rows;
    if (ak != bk || (uint64_t)am != D->rows || (uint64_t)bn != D->cols || C->rows != D->rows || C->cols != D->cols) {
        snprintf(why, nwhy, "sizes do not match: op(A) %lldx%lld, op(B) %lldx%lld, C %llux%llu, D %llux%llu",
                 (long long)am, (long long)ak, (long long)bk, (long long)bn, (unsigned long long)C->rows,
                 (unsigned long long)C->cols, (unsigned long long)D->rows, (unsigned long long)D->cols);
        return ST_INVALID_VALUE;
    }
    if (C->type != D->type || C->ld != D->ld) {
        snprintf(why, nwhy, "C and D layouts differ");
        return ST_INVALID_VALUE;
    }
    for (int i = 0; i < 2; i++) {
        int t = (i == 0 ? A : B)->type;
        if (d->input_type[i] >= 0 && d->input_type[i] != t) {
            snprintf(why, nwhy, "COMPUTE_INPUT_TYPE conversions are not computed by the stand-in");
            return ST_NOT_SUPPORTED;
        }
    }
    if (D->type != R_32F && D->type != R_16F && D->type != R_16BF) {
        snprintf(why, nwhy, "D type %d: only fp32, fp16, bf16", D->type);
        return ST_NOT_SUPPORTED;
    }
    p->m = am;
    p->n = bn;
    p->k = ak;
    if (d->epilogue == EPILOGUE_BIAS) {
        int bt = d->bias_type < 0 ? D->type : d->bias_type;
        if (bt != R_32F && bt != D->type) {
            snprintf(why, nwhy, "BIAS_DATA_TYPE %d: must be the D type (%d) or HIP_R_32F", bt, D->type);
            return ST_INVALID_VALUE;
        }
    }
    if (v >= V(1, 0)) {
        int mode_a = d->scale_mode[0], mode_b = d->scale_mode[1];
        for (int i = 0; i < 2; i++) {
            if (d->scale_mode[i] != SCALE_SCALAR_32F && d->scale_mode[i] != SCALE_OUTER_VEC_32F) {
                snprintf(why, nwhy, "scale mode %d is not computed by the stand-in", d->scale_mode[i]);
                return ST_NOT_SUPPORTED;
            }
        }
        if (d->scale[0] && d->scale[1] && mode_a != mode_b) {
            snprintf(why, nwhy, "Scale A and Scale B must be both scalar, vector or block (modes %d, %d)", mode_a, mode_b);
            return ST_INVALID_VALUE;
        }
        p->vector = mode_a == SCALE_OUTER_VEC_32F || mode_b == SCALE_OUTER_VEC_32F;
    } else {
        if (d->scale_vec[0] != d->scale_vec[1]) {
            snprintf(why, nwhy, "Scale A and Scale B must be both scalar or vector");
            return ST_INVALID_VALUE;
        }
        p->vector = d->scale_vec[0];
    }
    /* Which fp8 formats the arch's matrix cores take: fnuz on gfx942, OCP on gfx950 (hipBLASLt 1.0+). */
    int gfx950 = strcmp(g_arch, "gfx950") == 0;
    int ok = gfx950 ? (is_ocp(A->type) && is_ocp(B->type) && v >= V(1, 0))
                    : (is_fnuz(A->type) && is_fnuz(B->type));
    if (!ok) {
        snprintf(why, nwhy, "no kernel for A type %d x B type %d on %s (version %d)", A->type, B->type, g_arch, v);
        return ST_NOT_SUPPORTED;
    }
    return ST_SUCCESS;
}

/* A fingerprint of everything that makes two problems the same for an algorithm: sizes, types,
 * layouts, transposes, epilogue, scale kinds (not the pointers). */
static uint64_t problem_hash(const Desc *d, const Layout *L[4], const Problem *p) {
    int64_t words[32];
    int n = 0;
    words[n++] = d->op[0]; words[n++] = d->op[1]; words[n++] = d->epilogue; words[n++] = d->bias_type;
    words[n++] = p->vector; words[n++] = d->scale[0] != NULL; words[n++] = d->scale[1] != NULL;
    for (int i = 0; i < 4; i++) {
        words[n++] = L[i]->type; words[n++] = (int64_t)L[i]->rows; words[n++] = (int64_t)L[i]->cols; words[n++] = L[i]->ld;
    }
    uint64_t h = 1469598103934665603ull;
    const unsigned char *bytes = (const unsigned char *)words;
    for (size_t i = 0; i < n * sizeof(int64_t); i++) h = (h ^ bytes[i]) * 1099511628211ull;
    return h;
}

typedef struct { int32_t id; uint64_t hash; uint64_t workspace; } Issued;
static Issued *g_issued;
static size_t g_n_issued, g_cap_issued;

hipblasStatus_t hipblasLtMatmulAlgoGetHeuristic(void *handle, void *desc, void *a, void *b, void *c, void *dl,
                                                void *pref, int requested, hipblasLtMatmulHeuristicResult_t *results,
                                                int *count) {
    const char *fn = "hipblasLtMatmulAlgoGetHeuristic";
    const char *bad;
    if ((bad = bad_obj(handle, K_HANDLE))) return fail(fn, ST_INVALID_VALUE, "handle: %s", bad);
    if ((bad = bad_obj(desc, K_DESC))) return fail(fn, ST_INVALID_VALUE, "matmulDesc: %s", bad);
    void *layouts[4] = {a, b, c, dl};
    for (int i = 0; i < 4; i++)
        if ((bad = bad_obj(layouts[i], K_LAYOUT))) return fail(fn, ST_INVALID_VALUE, "layout %c: %s", "ABCD"[i], bad);
    if ((bad = bad_obj(pref, K_PREF))) return fail(fn, ST_INVALID_VALUE, "pref: %s", bad);
    if (requested < 1) return fail(fn, ST_INVALID_VALUE, "requestedAlgoCount %d < 1", requested);
    if (!results || !count) return fail(fn, ST_INVALID_VALUE, "heuristicResultsArray or returnAlgoCount is NULL");
    const Desc *d = desc;
    const Layout *L[4] = {a, b, c, dl};
    const Pref *p = pref;
    Problem prob = {0};
    char why[512];
    hipblasStatus_t st = check_problem(d, L[0], L[1], L[2], L[3], &prob, why, sizeof why);
    *count = 0;
    if (st == ST_NOT_SUPPORTED) {   /* a valid problem no kernel serves: no algorithm */
        logf_("%s count=0 status=0 why=%s", fn, why);
        return ST_SUCCESS;
    }
    if (st != ST_SUCCESS) return fail(fn, st, "%s", why);
    int honour_limit = g_heuristic != HEUR_IGNORE_LIMIT;
    if (g_heuristic == HEUR_NONE || (honour_limit && g_workspace_need > p->max_workspace)) {
        logf_("%s count=0 status=0 why=no algorithm (workspace need %llu, limit %llu)", fn,
              (unsigned long long)g_workspace_need, (unsigned long long)p->max_workspace);
        return ST_SUCCESS;
    }
    if (g_n_issued == g_cap_issued) {
        size_t cap = g_cap_issued ? 2 * g_cap_issued : 64;
        Issued *grown = realloc(g_issued, cap * sizeof *grown);
        if (!grown) return fail(fn, ST_INVALID_VALUE, "out of memory");
        g_issued = grown;
        g_cap_issued = cap;
    }
    Issued *is = &g_issued[g_n_issued];
    is->id = (int32_t)(g_n_issued + 1);
    is->hash = problem_hash(d, L, &prob);
    is->workspace = g_workspace_need;
    g_n_issued++;
    memset(&results[0], 0, sizeof results[0]);
    memcpy(results[0].algo.data, &is->id, 4);
    memcpy(results[0].algo.data + 4, &is->hash, 8);
    results[0].algo.max_workspace_bytes = p->max_workspace;
    results[0].workspaceSize = is->workspace;
    results[0].state = g_heuristic == HEUR_BAD_STATE ? ST_NOT_SUPPORTED : ST_SUCCESS;
    results[0].wavesCount = 1.0f;
    *count = 1;
    logf_("%s algo=%d m=%lld n=%lld k=%lld vector=%d workspace=%llu state=%d count=1 status=0", fn, is->id,
          (long long)prob.m, (long long)prob.n, (long long)prob.k, prob.vector,
          (unsigned long long)is->workspace, results[0].state);
    return ST_SUCCESS;
}

/* ---------------------------------------------------------------------------- numbers */

static float fp8_to_f32(uint8_t x, int type) {
    int e_bits = (type == R_8F_E4M3 || type == R_8F_E4M3_FNUZ) ? 4 : 5;
    int m_bits = 7 - e_bits;
    int fnuz = is_fnuz(type);
    int bias = (1 << (e_bits - 1)) - 1 + fnuz;     /* e4m3fn 7, e5m2 15, e4m3fnuz 8, e5m2fnuz 16 */
    int sign = x >> 7, e = (x >> m_bits) & ((1 << e_bits) - 1), m = x & ((1 << m_bits) - 1);
    if (fnuz && x == 0x80) return NAN;              /* fnuz: the only NaN, no -0 */
    if (type == R_8F_E4M3 && e == 15 && m == 7) return NAN;
    if (type == R_8F_E5M2 && e == 31) return m ? NAN : (sign ? -INFINITY : INFINITY);
    float v = e == 0 ? ldexpf((float)m, 1 - bias - m_bits) : ldexpf((float)(m + (1 << m_bits)), e - bias - m_bits);
    return sign ? -v : v;
}

static float f16_to_f32(uint16_t h) {
    int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m + 1024), e - 25);
    return sign ? -v : v;
}

static float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even, as torch's casts do. */
static uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

static uint16_t f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (u >> 16) & 0x8000;
    uint32_t a = u & 0x7fffffff;
    if (a > 0x7f800000) return sign | 0x7e00;
    if (a >= 0x477ff000) return sign | 0x7c00;      /* 65520 and up round to infinity */
    if (a < 0x38800000) {                           /* below 2^-14: a subnormal half (or zero) */
        float v;
        memcpy(&v, &a, 4);
        return sign | (uint16_t)nearbyintf(v * 16777216.0f);   /* units of 2^-24 */
    }
    uint32_t h = ((a >> 23) - 112) << 10 | ((a >> 13) & 0x3ff);
    uint32_t rest = a & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return sign | (uint16_t)h;
}

static float load(const void *base, int64_t index, int type) {
    switch (type) {
    case R_32F: return ((const float *)base)[index];
    case R_16F: return f16_to_f32(((const uint16_t *)base)[index]);
    case R_16BF: return bf16_to_f32(((const uint16_t *)base)[index]);
    default: return fp8_to_f32(((const uint8_t *)base)[index], type);
    }
}

static void store(void *base, int64_t index, int type, float v) {
    switch (type) {
    case R_32F: ((float *)base)[index] = v; break;
    case R_16F: ((uint16_t *)base)[index] = f32_to_f16(v); break;
    default: ((uint16_t *)base)[index] = f32_to_bf16(v); break;
    }
}

/* Element (i, j) of op(X) for a column-major X with leading dimension ld. */
static float op_at(const void *x, const Layout *l, int op, int64_t i, int64_t j) {
    return op == OP_N ? load(x, i + j * l->ld, l->type) : load(x, j + i * l->ld, l->type);
}

hipblasStatus_t hipblasLtMatmul(void *handle, void *desc, const void *alpha, const void *A, void *la,
                                const void *B, void *lb, const void *beta, const void *C, void *lc, void *D,
                                void *ld, const hipblasLtMatmulAlgo_t *algo, void *workspace,
                                size_t workspace_size, void *stream) {
    const char *fn = "hipblasLtMatmul";
    const char *bad;
    if ((bad = bad_obj(handle, K_HANDLE))) return fail(fn, ST_INVALID_VALUE, "handle: %s", bad);
    if ((bad = bad_obj(desc, K_DESC))) return fail(fn, ST_INVALID_VALUE, "matmulDesc: %s", bad);
    void *layouts[4] = {la, lb, lc, ld};
    for (int i = 0; i < 4; i++)
        if ((bad = bad_obj(layouts[i], K_LAYOUT))) return fail(fn, ST_INVALID_VALUE, "layout %c: %s", "ABCD"[i], bad);
    const Desc *d = desc;
    const Layout *L[4] = {la, lb, lc, ld};
    Problem prob = {0};
    char why[512];
    hipblasStatus_t st = check_problem(d, L[0], L[1], L[2], L[3], &prob, why, sizeof why);
    if (st != ST_SUCCESS) return fail(fn, st, "%s", why);
    if (!alpha || !beta) return fail(fn, ST_INVALID_VALUE, "alpha or beta is NULL");
    float fa, fb;
    memcpy(&fa, alpha, 4);
    memcpy(&fb, beta, 4);
    if (!A || !B || !D || (fb != 0 && !C)) return fail(fn, ST_INVALID_VALUE, "a matrix pointer is NULL");
    if (!algo) return fail(fn, ST_INVALID_VALUE, "algo is NULL (the stand-in has no default algorithm)");
    int32_t id;
    uint64_t hash;
    memcpy(&id, algo->data, 4);
    memcpy(&hash, algo->data + 4, 8);
    if (id < 1 || (size_t)id > g_n_issued) return fail(fn, ST_INVALID_VALUE, "algo %d was not returned by the heuristic", id);
    const Issued *is = &g_issued[id - 1];
    if (is->hash != hash || hash != problem_hash(d, L, &prob))
        return fail(fn, ST_INVALID_VALUE, "algo %d was found for another problem", id);
    if (workspace_size < is->workspace)
        return fail(fn, ST_INVALID_VALUE, "workspaceSizeInBytes %zu < %llu the algo needs", workspace_size,
                    (unsigned long long)is->workspace);
    if (workspace_size > 0 && !workspace) return fail(fn, ST_INVALID_VALUE, "workspace is NULL with a size");
    if (d->epilogue == EPILOGUE_BIAS && !d->bias) return fail(fn, ST_INVALID_VALUE, "bias epilogue without BIAS_POINTER");
    if (prob.vector && (!d->scale[0] || !d->scale[1]))
        return fail(fn, ST_INVALID_VALUE, "vector scales need both scale pointers");
    int bias_type = d->bias_type < 0 ? L[3]->type : d->bias_type;
    for (int64_t j = 0; j < prob.n; j++) {
        for (int64_t i = 0; i < prob.m; i++) {
            double acc = 0;
            for (int64_t p = 0; p < prob.k; p++)
                acc += (double)op_at(A, L[0], d->op[0], i, p) * op_at(B, L[1], d->op[1], p, j);
            float sa = !d->scale[0] ? 1.0f : ((const float *)d->scale[0])[prob.vector ? i : 0];
            float sb = !d->scale[1] ? 1.0f : ((const float *)d->scale[1])[prob.vector ? j : 0];
            float v = (fa * (sa * sb)) * (float)acc;
            if (fb != 0) v += fb * load(C, i + j * L[2]->ld, L[2]->type);
            if (d->epilogue == EPILOGUE_BIAS) v += load(d->bias, i, bias_type);
            store(D, i + j * L[3]->ld, L[3]->type, v);
        }
    }
    logf_("%s desc=%ld algo=%d a=%p b=%p c=%p d=%p workspace=%p workspace_size=%zu stream=%p "
          "scale_a=%p scale_b=%p bias=%p vector=%d status=0", fn, d->h.id, id, A, B, C, D, workspace,
          workspace_size, stream, d->scale[0], d->scale[1], d->bias, prob.vector);
    return ST_SUCCESS;
}

/* ---------------------------------------------------------------------------- test controls */

void standin_set_version(int v) { g_version = v; }

int standin_set_arch(const char *arch) {
    if (!arch || (strcmp(arch, "gfx942") && strcmp(arch, "gfx950"))) return -1;
    snprintf(g_arch, sizeof g_arch, "%s", arch);
    return 0;
}

void standin_set_heuristic(int mode, uint64_t workspace_need) {
    g_heuristic = mode;
    g_workspace_need = workspace_need;
}

/* Copies the log into buf (NUL-terminated, truncated to cap) and returns its full length. */
size_t standin_log(char *buf, size_t cap) {
    if (buf && cap) {
        size_t n = g_log_len < cap - 1 ? g_log_len : cap - 1;
        if (n) memcpy(buf, g_log, n);
        buf[n] = 0;
    }
    return g_log_len;
}

void standin_clear_log(void) { g_log_len = 0; }

long standin_live(int kind) { return kind >= 0 && kind < K_COUNT ? g_live[kind] : -1; }

size_t standin_sizeof_heuristic_result(void) { return sizeof(hipblasLtMatmulHeuristicResult_t); }
