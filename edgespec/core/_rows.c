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
 * - window(x, offset, offset_min_p, keep, ids) -> (top, count):
 *     a draft's window in one read: the row's max (NaN if it holds one), and the ids,
 *     ascending, of its `keep` largest values (ties in) at or above its floor.
 * - largest(x, keep, ids, t=0) -> (top, count, floor):
 *     top-k's candidates in one read: every value at or above `floor`, which the pass keeps
 *     at most a hair (1e-6 relative) below the keep-th largest; with a temperature t, cut
 *     to the keep largest and their near-ties (sampling._Maxima.top_ids's set; count -2
 *     where the list may miss some).
 * - at_least(x, floor, ids) -> int:
 *     the ids of the values >= floor (a float32), ascending, written into the int64 buffer
 *     `ids`, and their count; len(ids) + 1 if more reach it (the scan then stops there):
 *     NumPy's compare and nonzero in one read, with no row-sized mask (a draft's window,
 *     top-p's candidates).
 *
 * - filtered(x, ids, top, t, top_k, top_p, min_p, mass, margin, floored, out_ids,
 *            out_probs) -> int:
 *     sampling._filtered for a few candidates (a draft's window, a row's head) in one call
 *     instead of some twenty NumPy calls, each of which costs 5-15 µs right after a decode
 *     has streamed the caches out.
 *
 * - head(x, cols, slices, top, t, floor, max_head, guess, ids, w) -> (count, heads, rest,
 *        exact):
 *     sampling._head's sums and listing over a row's column maxima in one call.
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
#include <stdlib.h>
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

/* Whether any lane of a mask is set: shuffles and ors (a loop over the lanes is scalar) */
INLINE int any_lane(vi m) {
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
    m |= __builtin_shufflevector(m, m, 4, 5, 6, 7, 0, 1, 2, 3);
    m |= __builtin_shufflevector(m, m, 2, 3, 0, 1, 6, 7, 4, 5);
    m |= __builtin_shufflevector(m, m, 1, 0, 3, 2, 5, 4, 7, 6);
    return m[0] != 0;
#else
    int any = 0;
    for (int j = 0; j < W; j++) any |= m[j] != 0;
    return any;
#endif
}

/* The largest lane (no NaN) */
INLINE float hmax(vf g) {
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 12)
    vf h = __builtin_shufflevector(g, g, 4, 5, 6, 7, 0, 1, 2, 3);
    g = select_(h > g, h, g);
    h = __builtin_shufflevector(g, g, 2, 3, 0, 1, 6, 7, 4, 5);
    g = select_(h > g, h, g);
    h = __builtin_shufflevector(g, g, 1, 0, 3, 2, 5, 4, 7, 6);
    g = select_(h > g, h, g);
    return g[0];
#else
    float m = g[0];
    for (int j = 1; j < W; j++)
        if (g[j] > m) m = g[j];
    return m;
#endif
}

/* The k-th largest of v[0..m) (1 <= k <= m), v reordered: a quickselect, descending. */
static float kth_largest(float *v, Py_ssize_t m, Py_ssize_t k) {
    Py_ssize_t lo = 0, hi = m - 1, target = k - 1;
    while (lo < hi) {
        float a = v[lo], b = v[lo + (hi - lo) / 2], c = v[hi];
        float pivot = a > b ? (b > c ? b : (a > c ? c : a)) : (a > c ? a : (b > c ? c : b));
        Py_ssize_t i = lo, j = hi;
        while (i <= j) {
            while (v[i] > pivot) i++;
            while (v[j] < pivot) j--;
            if (i <= j) {
                float t = v[i];
                v[i++] = v[j];
                v[j--] = t;
            }
        }
        if (target <= j) hi = j;
        else if (target >= i) lo = i;
        else return v[target]; /* (between j and i: equal to the pivot) */
    }
    return v[target];
}

#define WINDOW_MAX 4096

/* The keep-th largest of the listed ids' values (1 <= keep <= count <= WINDOW_MAX). */
static float listed_kth(const float *x, const int64_t *ids, Py_ssize_t count, Py_ssize_t keep) {
    float vals[WINDOW_MAX];
    /* (GCC cannot see that the first `count` values, all that kth_largest reads, are set) */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
    for (Py_ssize_t j = 0; j < count; j++) vals[j] = x[ids[j]];
    float kth = kth_largest(vals, count, keep);
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
    return kth;
}

/* Keeps the listed ids whose value is at least `floor`, in order. Returns the new count. */
static Py_ssize_t keep_listed(const float *x, int64_t *ids, Py_ssize_t count, float floor) {
    Py_ssize_t kept = 0;
    for (Py_ssize_t j = 0; j < count; j++)
        if (x[ids[j]] >= floor) ids[kept++] = ids[j];
    return kept;
}

/* Keeps the listed ids whose value is at least the keep-th largest of theirs (ties in),
 * in order; raises *floor to that value. Returns the new count. */
static Py_ssize_t compact(const float *x, int64_t *ids, Py_ssize_t count, Py_ssize_t keep,
                          float *floor, int slack) {
    if (count < keep || count > WINDOW_MAX) return count; /* (never: the list is full) */
    float kth = listed_kth(x, ids, count, keep);
    /* slack: lowered by 1e-6 of the value (and of 1), so that logits within a hair of the
     * keep-th largest stay listed (top-k's caller adds those whose float64 weight may round
     * onto the keep-th's, within 1e-9 of it) */
    if (slack) kth -= 1e-6f * (1.0f + fabsf(kth));
    if (kth > *floor) *floor = kth;
    return keep_listed(x, ids, count, *floor);
}

/* m + offset, lowered by ~8 float32 steps of the larger: never above the caller's floor,
 * however that rounds its own sum */
INLINE float below(float m, float offset) {
    return (m + offset) - (fabsf(m) + fabsf(offset)) * 0x1p-20f;
}

/* One pass: the row's max, and the ids (ascending) of a superset of its `keep` largest values
 * that are at least max + offset (ties in). The floor rises with the running max, and when
 * the list fills, to the keep-th largest value listed (the row's keep-th largest is at least
 * that, less a hair). *top gets the max, or NaN (and the count is moot) if the row holds
 * one; *dropped the floor at the end: every value at or above it is listed. Returns the
 * count, or -1 if ties at that value fill half the list.
 *
 * A group of 64 values with none at or above the floor (nor NaN) costs a compare per value:
 * it cannot hold a new max either (the floor is below the max). Only the others are read
 * again, for their max and their ids. */
#define GROUP 8
CLONES static Py_ssize_t window_impl(const float *x, Py_ssize_t n, float offset,
                                     Py_ssize_t keep, int64_t *ids, Py_ssize_t cap,
                                     float *top, float *dropped) {
    float m = -INFINITY, floor = -INFINITY;
    Py_ssize_t count = 0, i = 0;
    *top = NAN;
    for (; i + GROUP * W <= n; i += GROUP * W) {
        vf v[GROUP];
        const vf f = splat(floor);
        vi hit = {0};
        for (int a = 0; a < GROUP; a++) {
            v[a] = load(x + i + a * W);
            hit |= ~(v[a] < f); /* (NaN: a hit) */
        }
        if (!any_lane(hit)) continue;
        vf g = v[0];
        vi nan = v[0] != v[0];
        for (int a = 1; a < GROUP; a++) {
            g = select_(v[a] > g, v[a], g);
            nan |= v[a] != v[a];
        }
        if (any_lane(nan)) return 0;
        float gm = hmax(g);
        if (gm > m) {
            m = gm;
            if (below(m, offset) > floor) floor = below(m, offset);
        }
        if (count + GROUP * W > cap) {
            count = compact(x, ids, count, keep, &floor, 1);
            if (count + GROUP * W > cap) return -1;
        }
        const vf f2 = splat(floor);
        for (int a = 0; a < GROUP; a++) {
            vi h = v[a] >= f2;
            if (!any_lane(h)) continue;
            for (int j = 0; j < W; j++) {
                ids[count] = i + a * W + j;
                count -= h[j]; /* (a hit's lane is -1) */
            }
        }
    }
    for (Py_ssize_t j = i; j < n; j++) { /* the row's last values */
        if (x[j] != x[j]) return 0;
        if (x[j] > m) m = x[j];
    }
    if (below(m, offset) > floor) floor = below(m, offset);
    if (count + GROUP * W > cap) {
        count = compact(x, ids, count, keep, &floor, 1);
        if (count + GROUP * W > cap) return -1;
    }
    for (Py_ssize_t j = i; j < n; j++)
        if (x[j] >= floor) ids[count++] = j;
    *top = m;
    *dropped = floor;
    return count;
}

/* The window itself from window_impl's list: the ids at or above the caller's exact floor,
 * float32(max(float32(top + offset), top + offset_min_p)) (sampling.draft_distribution's
 * arithmetic), and of those, if more than `keep`, the ones at or above the keep-th largest
 * (ties in), ascending. */
static Py_ssize_t window_cut(const float *x, int64_t *ids, Py_ssize_t count, float top,
                             double offset, double offset_min_p, Py_ssize_t keep) {
    double f = (double)(float)((double)top + offset);
    if ((double)top + offset_min_p > f) f = (double)top + offset_min_p;
    const float floor = (float)f;
    Py_ssize_t kept = 0;
    for (Py_ssize_t j = 0; j < count; j++)
        if (x[ids[j]] >= floor) ids[kept++] = ids[j];
    if (kept > keep) {
        float kth = floor;
        kept = compact(x, ids, kept, keep, &kth, 0);
    }
    return kept;
}

/* Compares a group of 64 values (8 vectors, their masks or-ed) at a time, then lists the ids
 * of each vector with a hit, without branches: a high floor costs one compare per value, and
 * a low one one store per value of the vectors that hold hits. Stops once more than `cap`
 * values reach the floor and returns cap + 1. */
CLONES static Py_ssize_t at_least_impl(const float *x, Py_ssize_t n, float floor,
                                       int64_t *ids, Py_ssize_t cap) {
    const vf f = splat(floor);
    Py_ssize_t count = 0, i = 0;
    for (; i + GROUP * W <= n; i += GROUP * W) {
        vi hits[GROUP], hit = {0};
        for (int g = 0; g < GROUP; g++) hit |= hits[g] = load(x + i + g * W) >= f;
        if (!any_lane(hit)) continue;
        for (int g = 0; g < GROUP; g++) {
            if (!any_lane(hits[g])) continue;
            if (count + W > cap) { /* too near the end of ids for the unchecked stores */
                for (int j = 0; j < W; j++)
                    if (hits[g][j]) {
                        if (count == cap) return cap + 1;
                        ids[count++] = i + g * W + j;
                    }
                continue;
            }
            for (int j = 0; j < W; j++) {
                ids[count] = i + g * W + j;
                count -= hits[g][j]; /* (a hit's lane is -1) */
            }
        }
    }
    for (; i < n; i++)
        if (x[i] >= floor) {
            if (count == cap) return cap + 1;
            ids[count++] = i;
        }
    return count;
}

/* NumPy's sum of float64 values (pairwise: eight running sums in blocks of up to 128), so
 * that a normaliser here is bit for bit the one NumPy's path divides by */
static double numpy_sum(const double *a, Py_ssize_t n) {
    if (n < 8) {
        double r = 0.0;
        for (Py_ssize_t i = 0; i < n; i++) r += a[i];
        return r;
    }
    if (n <= 128) {
        double r[8];
        for (int j = 0; j < 8; j++) r[j] = a[j];
        Py_ssize_t i = 8;
        for (; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += a[i + j];
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += a[i];
        return res;
    }
    Py_ssize_t n2 = n / 2;
    n2 -= n2 % 8;
    return numpy_sum(a, n2) + numpy_sum(a + n2, n - n2);
}

/* Sorts positions by descending weight, ties in the order given (a stable merge sort: the
 * positions come in ascending id order, so ties go to the lowest id, as lexsort's). */
static void order_by_weight(int32_t *pos, int32_t *tmp, Py_ssize_t n, const double *w) {
    for (Py_ssize_t width = 1; width < n; width *= 2) {
        for (Py_ssize_t lo = 0; lo < n; lo += 2 * width) {
            Py_ssize_t mid = lo + width < n ? lo + width : n;
            Py_ssize_t hi = lo + 2 * width < n ? lo + 2 * width : n;
            Py_ssize_t a = lo, b = mid, k = lo;
            while (a < mid && b < hi) tmp[k++] = w[pos[b]] > w[pos[a]] ? pos[b++] : pos[a++];
            while (a < mid) tmp[k++] = pos[a++];
            while (b < hi) tmp[k++] = pos[b++];
        }
        memcpy(pos, tmp, n * sizeof *pos);
    }
}

#define FILTER_MAX 4096

static Py_ssize_t filter_rows(const float *, const int64_t *, Py_ssize_t, double, double,
                              Py_ssize_t, double, double, double, double, int, int64_t *,
                              double *, double *, double *, double *, int32_t *, int32_t *);

/* sampling._filtered for up to FILTER_MAX candidates, in one call: float64 weights
 * exp((x[id] - top) / t), then top-k, top-p, min-p in that order, the kept ids ascending
 * and their probabilities. The same arithmetic as NumPy's path, operation for operation
 * (the cumulative sums in order, the normaliser as NumPy sums it), so the same result.
 * `mass` < 0: top-p's total is the candidates' (else a whole row's, given, summed from
 * float32 weights: where a cut falls within `margin` of it, relative, -1 is returned and the
 * caller's NumPy path decides). Returns the count kept (-1 also if nothing is kept), or -2
 * if memory ran out. */
static Py_ssize_t filter_impl(const float *x, const int64_t *ids, Py_ssize_t m, double top,
                              double t, Py_ssize_t top_k, double top_p, double min_p,
                              double mass, double margin, int floored, int64_t *out_ids,
                              double *out_p) {
    /* (on the heap: ~130 KB would strain a small thread stack) */
    double *w = malloc(m * (3 * sizeof(double) + 2 * sizeof(int32_t)));
    if (!w) return -2;
    double *kept_w = w + m, *before = w + 2 * m;
    int32_t *pos = (int32_t *)(w + 3 * m), *tmp = pos + m;
    Py_ssize_t count = filter_rows(x, ids, m, top, t, top_k, top_p, min_p, mass, margin,
                                   floored, out_ids, out_p, w, kept_w, before, pos, tmp);
    free(w);
    return count;
}

static Py_ssize_t filter_rows(const float *x, const int64_t *ids, Py_ssize_t m, double top,
                              double t, Py_ssize_t top_k, double top_p, double min_p,
                              double mass, double margin, int floored, int64_t *out_ids,
                              double *out_p,
                              double *w, double *kept_w, double *before, int32_t *pos,
                              int32_t *tmp) {
    for (Py_ssize_t i = 0; i < m; i++) w[i] = exp(((double)x[ids[i]] - top) / t);
    Py_ssize_t n = m;
    for (Py_ssize_t i = 0; i < m; i++) pos[i] = (int32_t)i;
    int cut_k = top_k > 0 && top_k < m;
    if (cut_k || top_p < 1.0) {
        order_by_weight(pos, tmp, m, w);
        if (cut_k) {
            n = top_k;
            mass = -1.0;
        }
        if (top_p < 1.0) {
            double cum = 0.0;
            for (Py_ssize_t j = 0; j < n; j++) {
                cum += w[pos[j]];
                before[j] = cum - w[pos[j]];
            }
            double total = mass < 0.0 ? cum : mass, goal = top_p * total;
            Py_ssize_t kept = 0;
            for (Py_ssize_t j = 0; j < n; j++) {
                if (mass >= 0.0 && fabs(before[j] - goal) <= margin * total) return -1;
                if (before[j] < goal) pos[kept++] = pos[j];
            }
            n = kept;
        }
        /* back to ascending positions (so ascending ids) */
        memset(tmp, 0, m * sizeof *tmp);
        for (Py_ssize_t j = 0; j < n; j++) tmp[pos[j]] = 1;
        n = 0;
        for (Py_ssize_t i = 0; i < m; i++)
            if (tmp[i]) pos[n++] = (int32_t)i;
    }
    double floor = -1.0; /* a weight is kept if above it (> 0 unless floored) */
    int at_least = 0;
    if (min_p > 0.0) {
        double wmax = 0.0;
        for (Py_ssize_t j = 0; j < n; j++)
            if (w[pos[j]] > wmax) wmax = w[pos[j]];
        floor = min_p * wmax;
        at_least = 1;
    }
    Py_ssize_t count = 0;
    for (Py_ssize_t j = 0; j < n; j++) {
        double v = w[pos[j]];
        if ((at_least ? v >= floor : 1) && (floored || v > 0.0)) {
            out_ids[count] = ids[pos[j]];
            kept_w[count++] = v;
        }
    }
    if (count == 0) return -1;
    double z = numpy_sum(kept_w, count);
    for (Py_ssize_t j = 0; j < count; j++) out_p[j] = kept_w[j] / z;
    return count;
}

/* sampling._head's arithmetic over a row's column maxima, in one call. The row is `slices`
 * rows of `width` side by side (column c: ids c, width + c, ...), then a tail of fewer ids.
 * Head columns: those whose maximum is >= floor (more than max_head: returns -1, a flat
 * row). The maxima's weights exp((m - top) * inv_t), in float32 as the row's Dense form
 * weighs (~1e-7 off; the caller's bounds allow 2e-5), summed as doubles: `heads` over the
 * head columns, `rest` over the others. `guess` > 0: return -2 when
 * heads + slices * rest > guess * (heads + rest) (bounds that loose are not worth the head's
 * exps). Else every logit of the head columns and of the tail, weighed in float64 as
 * exp((v - top) / t) (NumPy's _scaled_exp, operation for operation), summed into `exact`,
 * and those >= floor listed with their weights, ids ascending. Returns the count listed. */
static Py_ssize_t head_impl(const float *x, Py_ssize_t n, Py_ssize_t width, Py_ssize_t slices,
                            const float *cols, double top, double t, float floor,
                            Py_ssize_t max_head, double guess, int64_t *ids, double *w,
                            double *heads, double *rest, double *exact) {
    int32_t head[64];
    Py_ssize_t nh = 0;
    for (Py_ssize_t c = 0; c < width; c++)
        if (cols[c] >= floor) {
            if (nh == max_head || nh == 64) return -1;
            head[nh++] = (int32_t)c;
        }
    const vf vt = splat((float)top), vs = splat((float)(1.0 / t));
    const int scale = (float)(1.0 / t) != 1.0f;
    double all = 0.0;
    Py_ssize_t c = 0;
    for (; c + W <= width; c += W) {
        vf e = vexp(arg(load(cols + c), vt, vs, scale));
        for (int j = 0; j < W; j++) all += e[j];
    }
    if (c < width) {
        float buf[W];
        vf e = exp_tail(cols + c, buf, width - c, vt, vs, scale);
        for (int j = 0; j < W; j++) all += e[j];
    }
    double hw = 0.0;
    for (Py_ssize_t h = 0; h < nh; h++) {
        float one[W];
        vf e = exp_tail(cols + head[h], one, 1, vt, vs, scale);
        hw += e[0];
    }
    *heads = hw;
    *rest = all - hw > 0.0 ? all - hw : 0.0;
    if (guess > 0.0 && hw + (double)slices * *rest > guess * (hw + *rest)) return -2;
    double sum = 0.0;
    Py_ssize_t count = 0;
    for (Py_ssize_t r = 0; r < slices; r++)
        for (Py_ssize_t h = 0; h < nh; h++) {
            Py_ssize_t id = r * width + head[h];
            double v = exp(((double)x[id] - top) / t);
            sum += v;
            if (x[id] >= floor) {
                ids[count] = id;
                w[count++] = v;
            }
        }
    for (Py_ssize_t id = slices * width; id < n; id++) {
        double v = exp(((double)x[id] - top) / t);
        sum += v;
        if (x[id] >= floor) {
            ids[count] = id;
            w[count++] = v;
        }
    }
    *exact = sum;
    return count;
}

/* A buffer a function takes: C-contiguous, items of `size` bytes with a format among
 * `formats` (NumPy's int64 is 'l' on LP64 systems, 'q' elsewhere), writable if asked;
 * `what` names it in the error. */
typedef struct {
    PyObject *obj;
    int writable;
    Py_ssize_t size;
    const char *formats, *what;
} want;

#define F32(obj, writable, name) {obj, writable, 4, "f", name ": a float32 array"}
#define I64(obj, writable, name) {obj, writable, 8, "lq", name ": an int64 array"}
#define F64(obj, name) {obj, 1, 8, "d", name ": a writable float64 array"}

static void release(Py_buffer *b, int n) {
    while (n--) PyBuffer_Release(&b[n]);
}

/* Takes the n buffers asked for into b, or none (those taken released, an exception set):
 * 0 then. */
static int take(Py_buffer *b, const want *w, int n) {
    for (int i = 0; i < n; i++) {
        int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (w[i].writable ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(w[i].obj, &b[i], flags)) {
            release(b, i);
            return 0;
        }
        const char *f = b[i].format ? b[i].format : "B";
        if (*f == '<' || *f == '=' || *f == '@') f++;
        if (b[i].itemsize != w[i].size || strlen(f) != 1 || !strchr(w[i].formats, *f)) {
            PyErr_Format(PyExc_TypeError, "%s is needed", w[i].what);
            release(b, i + 1);
            return 0;
        }
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
    Py_buffer b[2], blocks = {0};
    const want asked[2] = {F32(xo, 0, "x"), F32(outo, 1, "out")};
    if (!take(b, asked, 2)) return NULL;
    Py_buffer x = b[0], out = b[1];
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
    release(b, 2);
    return ok ? PyFloat_FromDouble(total) : NULL;
}

static PyObject *mass_before(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *xo, *wo;
    Py_ssize_t y;
    if (!PyArg_ParseTuple(args, "OOn", &xo, &wo, &y)) return NULL;
    Py_buffer b[2];
    const want asked[2] = {F32(xo, 0, "x"), F32(wo, 0, "w")};
    if (!take(b, asked, 2)) return NULL;
    Py_buffer x = b[0], w = b[1];
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
    release(b, 2);
    return ok ? PyFloat_FromDouble(total) : NULL;
}

static PyObject *window(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *xo, *idso;
    double offset, offset_min_p;
    Py_ssize_t keep;
    if (!PyArg_ParseTuple(args, "OddnO", &xo, &offset, &offset_min_p, &keep, &idso)) return NULL;
    Py_buffer b[2];
    const want asked[2] = {F32(xo, 0, "x"), I64(idso, 1, "ids")};
    if (!take(b, asked, 2)) return NULL;
    Py_buffer x = b[0], ids = b[1];
    Py_ssize_t cap = ids.len / (Py_ssize_t)sizeof(int64_t);
    if (cap > WINDOW_MAX) cap = WINDOW_MAX;
    Py_ssize_t count = -1;
    float top = NAN;
    int ok = offset <= 0.0 && !(offset_min_p > 0.0) && keep >= 1 && cap >= keep + 8 * W * 2;
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "window: offsets <= 0, keep >= 1 and room in ids "
                                          "for keep + 128");
    } else {
        const float *xs = x.buf;
        int64_t *is = ids.buf;
        /* (the scan's floor: the higher offset, lowered by a margin inside window_impl) */
        float scan = (float)(offset_min_p > offset ? offset_min_p : offset);
        Py_BEGIN_ALLOW_THREADS
        float dropped;
        count = window_impl(xs, x.len / (Py_ssize_t)sizeof(float), scan, keep, is, cap, &top,
                            &dropped);
        if (count >= 0 && top == top && isfinite(top))
            count = window_cut(xs, is, count, top, offset, offset_min_p, keep);
        Py_END_ALLOW_THREADS
    }
    release(b, 2);
    if (!ok) return NULL;
    return Py_BuildValue("dn", (double)top, count);
}

/* sampling._Maxima.top_ids's near-tie cut on window_impl's list (every value at or above
 * `dropped`, which is at most a hair below the keep-th largest): the keep largest and every
 * value whose float64 weight at temperature t may round onto the keep-th's, those at or above
 * tie = kth - 1e-9 * (t + |kth| + |top|) (sampling._tie_floor's arithmetic, in its order).
 * Returns the new count and sets *floor to float32(tie); -2 where the list may miss some: a
 * tie floor below `dropped`, or weights so small (subnormal) that ties span wide ranges. */
static Py_ssize_t tie_cut(const float *x, int64_t *ids, Py_ssize_t count, Py_ssize_t keep,
                          double t, float top, float dropped, float *floor) {
    if (count < keep || count > WINDOW_MAX) return -2; /* (never with a finite max) */
    double kth = listed_kth(x, ids, count, keep);
    if ((kth - top) / t < -700.0) return -2;
    /* (volatile: no fused multiply-add, which would round otherwise than Python does) */
    volatile double margin = 1e-9 * (t + fabs(kth) + fabs((double)top));
    float tie = (float)(kth - margin);
    if (tie < dropped) return -2;
    *floor = tie;
    return keep_listed(x, ids, count, tie);
}

static PyObject *largest(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *xo, *idso;
    Py_ssize_t keep;
    double t = 0.0;
    if (!PyArg_ParseTuple(args, "OnO|d", &xo, &keep, &idso, &t)) return NULL;
    Py_buffer b[2];
    const want asked[2] = {F32(xo, 0, "x"), I64(idso, 1, "ids")};
    if (!take(b, asked, 2)) return NULL;
    Py_buffer x = b[0], ids = b[1];
    Py_ssize_t cap = ids.len / (Py_ssize_t)sizeof(int64_t);
    if (cap > WINDOW_MAX) cap = WINDOW_MAX;
    Py_ssize_t count = -1;
    float top = NAN, dropped = -INFINITY;
    int ok = keep >= 1 && cap >= keep + 8 * W * 2 && t >= 0.0;
    if (!ok) {
        PyErr_SetString(PyExc_ValueError,
                        "largest: keep >= 1, room in ids for keep + 128, and t >= 0");
    } else {
        Py_BEGIN_ALLOW_THREADS
        count = window_impl(x.buf, x.len / (Py_ssize_t)sizeof(float), -INFINITY, keep, ids.buf,
                            cap, &top, &dropped);
        if (t > 0.0 && count >= 0 && isfinite(top))
            count = tie_cut(x.buf, ids.buf, count, keep, t, top, dropped, &dropped);
        Py_END_ALLOW_THREADS
    }
    release(b, 2);
    if (!ok) return NULL;
    return Py_BuildValue("dnd", (double)top, count, (double)dropped);
}

static PyObject *at_least(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *xo, *idso;
    float floor;
    if (!PyArg_ParseTuple(args, "OfO", &xo, &floor, &idso)) return NULL;
    Py_buffer b[2];
    const want asked[2] = {F32(xo, 0, "x"), I64(idso, 1, "ids")};
    if (!take(b, asked, 2)) return NULL;
    Py_buffer x = b[0], ids = b[1];
    Py_ssize_t count;
    Py_BEGIN_ALLOW_THREADS
    count = at_least_impl(x.buf, x.len / (Py_ssize_t)sizeof(float), floor, ids.buf,
                          ids.len / (Py_ssize_t)sizeof(int64_t));
    Py_END_ALLOW_THREADS
    release(b, 2);
    return PyLong_FromSsize_t(count);
}

static PyObject *filtered(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *xo, *idso, *oido, *opo;
    double top, t, top_p, min_p, mass, margin;
    Py_ssize_t top_k;
    int floored;
    if (!PyArg_ParseTuple(args, "OOddnddddpOO", &xo, &idso, &top, &t, &top_k, &top_p, &min_p,
                          &mass, &margin, &floored, &oido, &opo))
        return NULL;
    Py_buffer b[4];
    const want asked[4] = {F32(xo, 0, "x"), I64(idso, 0, "ids"),
                           I64(oido, 1, "out_ids"), F64(opo, "out_probs")};
    if (!take(b, asked, 4)) return NULL;
    Py_buffer x = b[0], ids = b[1], oid = b[2], op = b[3];
    Py_ssize_t m = ids.len / 8, n = x.len / (Py_ssize_t)sizeof(float);
    Py_ssize_t count = -1;
    int ok = m <= FILTER_MAX && oid.len >= ids.len && op.len >= ids.len && t > 0.0;
    for (Py_ssize_t i = 0; ok && i < m; i++) ok = ((const int64_t *)ids.buf)[i] >= 0
                                                 && ((const int64_t *)ids.buf)[i] < n;
    if (!ok)
        PyErr_SetString(PyExc_ValueError, "filtered: at most 4096 ids, all inside x, outputs "
                                          "as long, and t > 0");
    else {
        Py_BEGIN_ALLOW_THREADS
        count = filter_impl(x.buf, ids.buf, m, top, t, top_k, top_p, min_p, mass, margin,
                            floored, oid.buf, op.buf);
        Py_END_ALLOW_THREADS
    }
    release(b, 4);
    if (!ok) return NULL;
    if (count == -2) return PyErr_NoMemory();
    return PyLong_FromSsize_t(count);
}

static PyObject *head(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *xo, *colso, *idso, *wo;
    Py_ssize_t slices, max_head;
    double top, t, guess;
    float floor;
    if (!PyArg_ParseTuple(args, "OOnddfndOO", &xo, &colso, &slices, &top, &t, &floor,
                          &max_head, &guess, &idso, &wo))
        return NULL;
    Py_buffer b[4];
    const want asked[4] = {F32(xo, 0, "x"), F32(colso, 0, "cols"),
                           I64(idso, 1, "ids"), F64(wo, "w")};
    if (!take(b, asked, 4)) return NULL;
    Py_buffer x = b[0], cols = b[1], ids = b[2], w = b[3];
    Py_ssize_t n = x.len / 4, width = cols.len / 4, cap = ids.len / 8;
    if (w.len / 8 < cap) cap = w.len / 8;
    int ok = slices >= 1 && width >= 1 && slices * width <= n && n - slices * width < slices
             && max_head >= 0 && max_head <= 64 && cap >= slices * max_head + slices && t > 0.0;
    Py_ssize_t count = 0;
    double heads = 0.0, rest = 0.0, exact = 0.0;
    if (!ok)
        PyErr_SetString(PyExc_ValueError, "head: slices x width within x (its tail shorter than "
                                          "slices), max_head <= 64, room for (max_head + 1) x "
                                          "slices ids, t > 0");
    else {
        Py_BEGIN_ALLOW_THREADS
        count = head_impl(x.buf, n, width, slices, cols.buf, top, t, floor, max_head, guess,
                          ids.buf, w.buf, &heads, &rest, &exact);
        Py_END_ALLOW_THREADS
    }
    release(b, 4);
    if (!ok) return NULL;
    return Py_BuildValue("nddd", count, heads, rest, exact);
}

/* byte_lanes[b][j]: all ones where bit j of b is set (masked's lanes, made on first use) */
static uint32_t byte_lanes[256][8];
static int byte_lanes_made = 0;

static void make_byte_lanes(void) {
    for (int b = 0; b < 256; b++)
        for (int j = 0; j < 8; j++) byte_lanes[b][j] = (b >> j) & 1 ? 0xffffffffu : 0u;
    byte_lanes_made = 1;
}

static PyObject *masked(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *xo, *bo, *oo;
    if (!PyArg_ParseTuple(args, "OOO", &xo, &bo, &oo)) return NULL;
    Py_buffer b[3];
    const want asked[3] = {F32(xo, 0, "x"), {bo, 0, 4, "iI", "bits: an int32 array"},
                           F32(oo, 1, "out")};
    if (!take(b, asked, 3)) return NULL;
    if (!byte_lanes_made) make_byte_lanes();
    Py_buffer x = b[0], bits = b[1], out = b[2];
    Py_ssize_t n = out.len / (Py_ssize_t)sizeof(float);
    Py_ssize_t nx = x.len / (Py_ssize_t)sizeof(float), nw = bits.len / 4, count = 0;
    Py_BEGIN_ALLOW_THREADS
    const float *xs = x.buf;
    const uint32_t *ws = bits.buf;
    float *os = out.buf;
    Py_ssize_t m = n < nx ? n : nx, full = m >> 5;
    if (full > nw) full = nw;
    for (Py_ssize_t w = 0; w < full; w++) {  /* whole words: a branch-free select */
        uint32_t word = ws[w];
        const float *xw = xs + (w << 5);
        float *ow = os + (w << 5);
        count += __builtin_popcount(word);
        if (word == 0xffffffffu) {  /* (most words are whole: the string states allow most) */
            memcpy(ow, xw, 32 * sizeof(float));
            continue;
        }
        if (word == 0u) {
            for (int j = 0; j < 32; j++) ow[j] = -INFINITY;
            continue;
        }
        uint32_t *ou = (uint32_t *)ow;
        const uint32_t *xu = (const uint32_t *)xw;
        for (int byte = 0; byte < 4; byte++) {  /* 8 lanes' masks from a table: no branch */
            const uint32_t *keep = byte_lanes[(word >> (8 * byte)) & 0xffu];
            for (int j = 0; j < 8; j++)  /* 0xff800000: -inf */
                ou[8 * byte + j] = (xu[8 * byte + j] & keep[j]) | (0xff800000u & ~keep[j]);
        }
    }
    for (Py_ssize_t i = full << 5; i < n; i++) {
        Py_ssize_t w = i >> 5;
        int on = i < nx && w < nw && ((ws[w] >> (i & 31)) & 1u);
        os[i] = on ? xs[i] : -INFINITY;
        count += on;
    }
    Py_END_ALLOW_THREADS
    release(b, 3);
    return PyLong_FromSsize_t(count);
}

static PyMethodDef methods[] = {
    {"masked", masked, METH_VARARGS,
     "masked(x, bits, out) -> int: out[i] = x[i] where bit i of the int32 words bits is set "
     "(and i < len(x)), else -inf, for every i < len(out); the count of tokens kept"},
    {"scaled_exp", scaled_exp, METH_VARARGS,
     "scaled_exp(x, out, top, inv_t, blocks=None, precise=False) -> float: "
     "out = exp((x - top) * inv_t), their sum (and each block of 256's into blocks); "
     "precise: every weight added as a float64, else float32 lanes within a block"},
    {"mass_before", mass_before, METH_VARARGS,
     "mass_before(x, w, y) -> float: sum of w over the ids before y in descending order of x "
     "(ties: lower ids first)"},
    {"window", window, METH_VARARGS,
     "window(x, offset, offset_min_p, keep, ids) -> (top, count): the max of x (NaN if it "
     "holds one) and a draft's window, ascending, into the int64 array ids: the keep largest "
     "values (ties in) at or above float32(max(float32(top + offset), top + offset_min_p)); "
     "count -1 if ties fill half of ids"},
    {"largest", largest, METH_VARARGS,
     "largest(x, keep, ids, t=0) -> (top, count, floor): the max of x (NaN if it holds one) "
     "and the ids, ascending, of every value at or above floor, which is at most the keep-th "
     "largest less 1e-6 of it (count -1 if ties there fill half of ids); t > 0: floor is "
     "the keep-th largest less sampling._tie_floor's margin at temperature t (count -2 where "
     "the list may miss a value at that floor)"},
    {"at_least", at_least, METH_VARARGS,
     "at_least(x, floor, ids) -> int: the ids of the values of x >= floor (as a float32), "
     "ascending, into the int64 array ids, and their count; len(ids) + 1 (and a stop) if "
     "more values reach it"},
    {"filtered", filtered, METH_VARARGS,
     "filtered(x, ids, top, t, top_k, top_p, min_p, mass, margin, floored, out_ids, "
     "out_probs) -> int: sampling._filtered over at most 4096 candidate ids (ascending "
     "int64): the kept ids and their probabilities into the outputs, and their count; -1 "
     "where the Python path must decide (a top-p cut within margin of a given mass >= 0)"},
    {"head", head, METH_VARARGS,
     "head(x, cols, slices, top, t, floor, max_head, guess, ids, w) -> (count, heads, rest, "
     "exact): sampling._head's sums over a row's column maxima and its head's logits (count "
     "-1: more than max_head columns reach floor; -2: the guess says the bounds are loose)"},
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
