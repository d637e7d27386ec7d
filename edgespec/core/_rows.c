/* Fused passes over one row of float32 logits, for edgespec.core.sampling (issue 10).
 *
 * A 151,936-wide row and its weights (2 x 600 KB) overflow a 512 KiB L2, so each NumPy pass
 * over them (a temporary written, then read back) is a trip to L3; these functions do in one
 * read what NumPy does in three to five. Pure functions of their buffers, no state. Written
 * with GCC/Clang vector extensions (no intrinsics: they compile to AVX2, SSE2 or NEON), and
 * with GCC on x86-64 Linux cloned for AVX2 + FMA and for the baseline, the clone picked when
 * the module loads: one build runs on any x86-64 CPU (an AVX-512 one takes the AVX2 clone;
 * 16-wide vectors were slower on AVX2, and no AVX-512 CPU was at hand to try them there).
 *
 * - scaled_exp(x, out, top, inv_t, blocks, precise) -> float:
 *     out[i] = exp((x[i] - top) * inv_t), the argument in float32 exactly as NumPy computes
 *     it (a subtraction, then a product; no product when inv_t is 1), and their sum; with
 *     `blocks`, also each block of 256 weights' sum. `precise`: every weight is added as a
 *     double (a top-p cut is placed against the total, and float32 partial sums, ~1e-7 of a
 *     block off, moved a token at the cut of one row in 2,808 against NumPy's path); else
 *     float32 lanes within a block, then doubles (~40% faster: the sum of a plain
 *     temperature row only scales its probabilities, by ~1e-8).
 * - mass_before(x, w, y) -> float:
 *     the weight before token y in descending order, ties to the lowest id: the sum of w[i]
 *     over x[i] > x[y], and over x[i] == x[y] for i < y (in float64).
 *
 * Every value goes through the same vector code, the row's tail included (padded), so tied
 * logits get the same weight wherever they sit. exp: Cephes' expf (range reduction by
 * ln 2 in two parts, a degree-5 polynomial; within 2e-7 relative of float64), 0 for -inf and
 * below float32's subnormals, subnormals where they fall (two exponent steps).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define W 8 /* floats per vector: one AVX2 register, two SSE2 or NEON (wider spills: measured slower) */
#define BLOCK 256

typedef float vf __attribute__((vector_size(W * 4)));
typedef int32_t vi __attribute__((vector_size(W * 4)));
typedef float vh __attribute__((vector_size(W * 2)));  /* half a vf */
typedef double vd __attribute__((vector_size(W * 4)));  /* a vh widened */

#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define CLONES
#endif
/* Always inlined, so no vector crosses a call between code built for different ISA levels,
 * where its ABI differs (GCC's -Wpsabi note is moot: the build passes -Wno-psabi). */
#define INLINE static inline __attribute__((always_inline))

INLINE vf load(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
INLINE void store(float *p, vf v) { memcpy(p, &v, sizeof v); }
INLINE vf splat(float a) { return (vf){0} + a; }
INLINE vf select_(vi m, vf a, vf b) { return (vf)(((vi)a & m) | ((vi)b & ~m)); }

/* acc += v, each float widened to a double (two halves: a whole vf as doubles spills) */
INLINE void add_wide(vd acc[2], vf v) {
    vh lo, hi;
    memcpy(&lo, &v, sizeof lo);
    memcpy(&hi, (const char *)&v + sizeof lo, sizeof hi);
    acc[0] += __builtin_convertvector(lo, vd);
    acc[1] += __builtin_convertvector(hi, vd);
}

INLINE double hsum(const vd acc[2]) {
    vd v = acc[0] + acc[1];
    double s = 0.0;
    for (int i = 0; i < W / 2; i++) s += v[i];
    return s;
}

/* exp of each lane (inputs <= 88; NaN is never passed: the sampler sends such rows elsewhere) */
INLINE vf vexp(vf x) {
    x = select_(x < splat(-110.0f), splat(-110.0f), x); /* -inf and the far tail: 0 below */
    vf fx = x * splat(1.44269504088896341f);
    const vf magic = splat(12582912.0f); /* 1.5 * 2^23: adds round to the nearest integer */
    fx = (fx + magic) - magic;
    x = x - fx * splat(0.693359375f);
    x = x - fx * splat(-2.12194440e-4f);
    vf z = x * x;
    vf y = splat(1.9875691500e-4f);
    y = y * x + splat(1.3981999507e-3f);
    y = y * x + splat(8.3334519073e-3f);
    y = y * x + splat(4.1665795894e-2f);
    y = y * x + splat(1.6666665459e-1f);
    y = y * x + splat(5.0000001201e-1f);
    y = y * z + x + splat(1.0f);
    /* times 2^n in two steps, so that n down to -159 gives subnormals and 0, not garbage */
    vi n = __builtin_convertvector(fx, vi);
    vi a = n >> 1, b = n - a;
    vf sa = (vf)((a + 127) << 23), sb = (vf)((b + 127) << 23);
    return (y * sa) * sb;
}

INLINE vf arg(vf v, vf top, vf inv_t, int scale) {
    v = v - top;
    return scale ? v * inv_t : v;
}

/* exp of the last m < W values of a block through the same vector code (padded with -inf,
 * weight 0), written to out; the padded vector back, for the block's sum */
INLINE vf exp_tail(const float *x, float *out, Py_ssize_t m, vf vt, vf vs, int scale) {
    float buf[W];
    for (int j = 0; j < W; j++) buf[j] = j < m ? x[j] : -INFINITY;
    vf e = vexp(arg(load(buf), vt, vs, scale));
    store(buf, e);
    memcpy(out, buf, m * sizeof(float));
    return e;
}

INLINE float hsum_float(vf v) {
    float s = 0.0f;
    for (int i = 0; i < W; i++) s += v[i];
    return s;
}

CLONES static double scaled_exp_impl(const float *x, float *out, Py_ssize_t n, float top,
                                     float inv_t, double *blocks, int precise) {
    const vf vt = splat(top), vs = splat(inv_t);
    const int scale = inv_t != 1.0f;
    double total = 0.0;
    Py_ssize_t i = 0;
    while (i < n) {
        Py_ssize_t end = i + BLOCK < n ? i + BLOCK : n;
        double s;
        if (precise) { /* every weight added as a double */
            vd acc[2] = {{0}, {0}};
            for (; i + W <= end; i += W) {
                vf e = vexp(arg(load(x + i), vt, vs, scale));
                store(out + i, e);
                add_wide(acc, e);
            }
            if (i < end) add_wide(acc, exp_tail(x + i, out + i, end - i, vt, vs, scale));
            s = hsum(acc);
        } else { /* float32 lanes over the block (~1e-7 of its sum), then a double */
            vf acc = {0};
            for (; i + W <= end; i += W) {
                vf e = vexp(arg(load(x + i), vt, vs, scale));
                store(out + i, e);
                acc += e;
            }
            if (i < end) acc += exp_tail(x + i, out + i, end - i, vt, vs, scale);
            s = hsum_float(acc);
        }
        i = end;
        if (blocks) *blocks++ = s;
        total += s;
    }
    return total;
}

CLONES static double mass_impl(const float *x, const float *w, Py_ssize_t n, float xy,
                               Py_ssize_t y) {
    const vf t = splat(xy);
    vi lane;
    for (int j = 0; j < W; j++) lane[j] = j;
    double total = 0.0;
    Py_ssize_t i = 0;
    while (i < n) {
        Py_ssize_t end = i + BLOCK < n ? i + BLOCK : n;
        vd acc[2] = {{0}, {0}};
        for (; i + W <= end; i += W) {
            vf v = load(x + i);
            vi heavier = v > t;
            if (i < y) /* ties before y count too */
                heavier |= (v == t) & (lane < (vi){0} + (int32_t)(y - i < W ? y - i : W));
            add_wide(acc, (vf)((vi)load(w + i) & heavier));
        }
        double s = hsum(acc);
        for (; i < end; i++)
            if (x[i] > xy || (x[i] == xy && i < y)) s += w[i];
        total += s;
    }
    return total;
}

/* A C-contiguous float32 buffer of `obj` (writable if asked), or 0 with an exception set. */
static int floats(PyObject *obj, Py_buffer *b, int writable, const char *name) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, b, flags) != 0) return 0;
    const char *f = b->format ? b->format : "B";
    if (*f == '<' || *f == '=' || *f == '@') f++;
    if (strcmp(f, "f") != 0 || b->itemsize != sizeof(float)) {
        PyErr_Format(PyExc_TypeError, "%s: a float32 array is needed", name);
        PyBuffer_Release(b);
        return 0;
    }
    return 1;
}

static PyObject *scaled_exp(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *xo, *outo, *blockso = Py_None;
    float top, inv_t;
    int precise = 0;
    if (!PyArg_ParseTuple(args, "OOff|Op", &xo, &outo, &top, &inv_t, &blockso, &precise))
        return NULL;
    Py_buffer x, out, blocks = {0};
    if (!floats(xo, &x, 0, "x")) return NULL;
    if (!floats(outo, &out, 1, "out")) {
        PyBuffer_Release(&x);
        return NULL;
    }
    Py_ssize_t n = x.len / (Py_ssize_t)sizeof(float);
    int ok = 1;
    if (out.len < x.len) {
        PyErr_SetString(PyExc_ValueError, "out is shorter than x");
        ok = 0;
    }
    if (ok && blockso != Py_None) {
        ok = PyObject_GetBuffer(blockso, &blocks, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT
                                                      | PyBUF_WRITABLE) == 0;
        if (ok && (blocks.itemsize != sizeof(double) || !blocks.format
                   || !strchr(blocks.format, 'd')
                   || blocks.len < (Py_ssize_t)(((n + BLOCK - 1) / BLOCK) * sizeof(double)))) {
            PyErr_SetString(PyExc_ValueError, "blocks: a float64 array, one per block of 256");
            ok = 0;
        }
    }
    double total = 0.0;
    if (ok) {
        Py_BEGIN_ALLOW_THREADS
        total = scaled_exp_impl(x.buf, out.buf, n, top, inv_t, blocks.buf, precise);
        Py_END_ALLOW_THREADS
    }
    if (blocks.obj) PyBuffer_Release(&blocks);
    PyBuffer_Release(&x);
    PyBuffer_Release(&out);
    return ok ? PyFloat_FromDouble(total) : NULL;
}

static PyObject *mass_before(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *xo, *wo;
    Py_ssize_t y;
    if (!PyArg_ParseTuple(args, "OOn", &xo, &wo, &y)) return NULL;
    Py_buffer x, w;
    if (!floats(xo, &x, 0, "x")) return NULL;
    if (!floats(wo, &w, 0, "w")) {
        PyBuffer_Release(&x);
        return NULL;
    }
    Py_ssize_t n = x.len / (Py_ssize_t)sizeof(float);
    int ok = 1;
    if (w.len < x.len || y < 0 || y >= n) {
        PyErr_SetString(PyExc_ValueError, "w is shorter than x, or y is outside x");
        ok = 0;
    }
    double total = 0.0;
    if (ok) {
        const float *xs = x.buf;
        Py_BEGIN_ALLOW_THREADS
        total = mass_impl(xs, w.buf, n, xs[y], y);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&x);
    PyBuffer_Release(&w);
    return ok ? PyFloat_FromDouble(total) : NULL;
}

static PyMethodDef methods[] = {
    {"scaled_exp", scaled_exp, METH_VARARGS,
     "scaled_exp(x, out, top, inv_t, blocks=None, precise=False) -> float: "
     "out = exp((x - top) * inv_t), their sum (and each block of 256's into blocks); "
     "precise: every weight added as a float64, else float32 lanes within a block"},
    {"mass_before", mass_before, METH_VARARGS,
     "mass_before(x, w, y) -> float: sum of w over the ids before y in descending order of x "
     "(ties: lower ids first)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_rows",
    .m_doc = "Fused passes over a row of float32 logits.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__rows(void) { return PyModule_Create(&module); }
