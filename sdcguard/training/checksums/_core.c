/* The CPU engine of the matmul checksum screen (sdcguard/training/checksum_bound.py, proof step (8a)).
 *
 * block_sums(a, c, dtype, batch, m, k, n, a_strides, c_strides, rows, v, s) sums each block of `rows`
 * consecutive rows of A (batch x m x k, any strides) into V and of C (batch x m x n) into S, in fp32 (the check's
 * working precision w), each operand read once in its memory order: a row-major operand adds whole rows, a
 * transposed one (A^T of a weight gradient) sums its contiguous runs in 8 lanes. Any order of summation is
 * within the gamma_w(b) of the proof. bfloat16 operands are widened exactly on load.
 *
 * magnitude_sums(a, dtype, batch, m, k, a_strides, rows, va): the same block sums of |A| (tier (c) needs them).
 *
 * cleared(s, r, v, va, b, batch, groups, k, n, b_strides, bias, bias_dtype, bias_len, rows, m, c_r, c_v) -> bool:
 * whether every block column satisfies tier (a), |S - R'| <= c_r |R'| with |R'| finite (R' = R + the block's rows
 * times the bias: a bias row of bias_len 1 or n, added in fp32 as the torch path adds it; bias_len 0: none), or
 * else tier (b), |S - R'| <= c_v L with L = sum_l |V_gl| |B_lj| + rows |bias_j| finite (B in fp32, any strides),
 * or else (when va is not 0) tier (c), the same with M, the block sums of |A| in place of |V|. True means the full
 * check's count is 0 for these S, R and V, whatever C is. The comparisons are computed in double; L and M in
 * double one column at a time, or in fp32 for all of a block's columns along B's contiguous rows (the fp32 the
 * proof allows for). It stops at the first block with a column no tier clears.
 *
 * Addresses rather than buffer objects (torch tensors do not export the buffer protocol): the caller keeps the
 * memory alive and checks the shapes, strides and dtypes. The GIL is released for the arithmetic.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define SDC_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SDC_CLONES
#endif

enum { F32 = 0, BF16 = 1 };

static inline float load(const unsigned char *p, int dt) {
    float f;
    if (dt == F32) {
        memcpy(&f, p, 4);
    } else {
        uint16_t h;
        memcpy(&h, p, 2);
        uint32_t w = (uint32_t)h << 16;
        memcpy(&f, &w, 4);
    }
    return f;
}

/* out[0:k] = sum over rows i0..i1 of x[i, 0:k]; x's element (i, l) at x + (i * si + l * sl) * es. */
static inline float load_abs(const unsigned char *p, int dt) { return fabsf(load(p, dt)); }

#define LOAD(p, dt) (absolute ? load_abs((p), (dt)) : load((p), (dt)))

static inline void sum_block(const unsigned char *x, int dt, int64_t es, int64_t i0, int64_t i1, int64_t k,
                             int64_t si, int64_t sl, float *out, const int absolute) {
    if (sl == 1) { /* row-major: add whole rows */
        memset(out, 0, (size_t)k * sizeof(float));
        for (int64_t i = i0; i < i1; i++) {
            const unsigned char *row = x + i * si * es;
            if (dt == F32)
                for (int64_t l = 0; l < k; l++) out[l] += LOAD(row + 4 * l, F32);
            else
                for (int64_t l = 0; l < k; l++) out[l] += LOAD(row + 2 * l, BF16);
        }
    } else if (si == 1) { /* transposed: each output sums one contiguous run */
        for (int64_t l = 0; l < k; l++) {
            const unsigned char *run = x + (l * sl + i0) * es;
            int64_t len = i1 - i0, i = 0;
            float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            if (dt == F32)
                for (; i + 8 <= len; i += 8)
                    for (int t = 0; t < 8; t++) lane[t] += LOAD(run + 4 * (i + t), F32);
            else
                for (; i + 8 <= len; i += 8)
                    for (int t = 0; t < 8; t++) lane[t] += LOAD(run + 2 * (i + t), BF16);
            float acc = ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
            for (; i < len; i++) acc += LOAD(run + i * es, dt);
            out[l] = acc;
        }
    } else {
        for (int64_t l = 0; l < k; l++) {
            float acc = 0;
            for (int64_t i = i0; i < i1; i++) acc += LOAD(x + (i * si + l * sl) * es, dt);
            out[l] = acc;
        }
    }
}

SDC_CLONES
static void sums(const unsigned char *x, int dt, int64_t batch, int64_t m, int64_t k, int64_t sb, int64_t si,
                 int64_t sl, int64_t rows, float *out, int absolute) {
    int64_t es = dt == F32 ? 4 : 2, groups = (m + rows - 1) / rows;
    for (int64_t bi = 0; bi < batch; bi++)
        for (int64_t g = 0; g < groups; g++) {
            int64_t i0 = g * rows, i1 = i0 + rows < m ? i0 + rows : m;
            if (absolute) /* two instances, so the plain one carries no test in its inner loops */
                sum_block(x + bi * sb * es, dt, es, i0, i1, k, si, sl, out + (bi * groups + g) * k, 1);
            else
                sum_block(x + bi * sb * es, dt, es, i0, i1, k, si, sl, out + (bi * groups + g) * k, 0);
        }
}

static PyObject *py_block_sums(PyObject *self, PyObject *args) {
    unsigned long long a, c, v, s;
    int dt;
    Py_ssize_t batch, m, k, n, asb, asi, asl, csb, csi, csl, rows;
    if (!PyArg_ParseTuple(args, "KKinnnn(nnn)(nnn)nKK", &a, &c, &dt, &batch, &m, &k, &n, &asb, &asi, &asl, &csb,
                          &csi, &csl, &rows, &v, &s))
        return NULL;
    if ((dt != F32 && dt != BF16) || batch < 1 || m < 1 || k < 1 || n < 1 || rows < 1)
        return PyErr_Format(PyExc_ValueError, "block_sums: bad dtype code or sizes");
    Py_BEGIN_ALLOW_THREADS
    sums((const unsigned char *)(uintptr_t)a, dt, batch, m, k, asb, asi, asl, rows, (float *)(uintptr_t)v, 0);
    sums((const unsigned char *)(uintptr_t)c, dt, batch, m, n, csb, csi, csl, rows, (float *)(uintptr_t)s, 0);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_magnitude_sums(PyObject *self, PyObject *args) {
    unsigned long long a, va;
    int dt;
    Py_ssize_t batch, m, k, asb, asi, asl, rows;
    if (!PyArg_ParseTuple(args, "Kinnn(nnn)nK", &a, &dt, &batch, &m, &k, &asb, &asi, &asl, &rows, &va)) return NULL;
    if ((dt != F32 && dt != BF16) || batch < 1 || m < 1 || k < 1 || rows < 1)
        return PyErr_Format(PyExc_ValueError, "magnitude_sums: bad dtype code or sizes");
    Py_BEGIN_ALLOW_THREADS
    sums((const unsigned char *)(uintptr_t)a, dt, batch, m, k, asb, asi, asl, rows, (float *)(uintptr_t)va, 1);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* out[j] = sum over l of |x[l]| |b[l, j]| for every column j of one block at once, B's rows contiguous (as a bf16
 * step's B often is), read along B's rows instead of down its columns and vectorized across them, in fp32: each
 * column's sum in l order, the k' + 1 roundings that proof step (8) allows for (bf16 results leave about a fifth
 * of the columns to tier (b)). */
SDC_CLONES
static void row_sweep(const float *x, const float *b0, int64_t k, int64_t n, int64_t bsk, float *out) {
    for (int64_t j = 0; j < n; j++) out[j] = 0;
    for (int64_t l = 0; l < k; l++) {
        float xl = fabsf(x[l]);
        const float *row = b0 + l * bsk;
        for (int64_t j = 0; j < n; j++) out[j] += xl * fabsf(row[j]);
    }
}

/* sum over l of |x[l]| |b[l, j]| for one column j, down B's column (any strides; a contiguous one in 4 lanes). Any
 * order of these sums is within the proof, which allows for them in fp32. */
SDC_CLONES
static double column_sum(const float *x, const float *bj0, int64_t k, int64_t bsk) {
    double acc = 0;
    int64_t l = 0;
    if (bsk == 1) {
        double lane[4] = {0, 0, 0, 0};
        for (; l + 4 <= k; l += 4)
            for (int t = 0; t < 4; t++) lane[t] += fabs((double)x[l + t]) * fabs((double)bj0[l + t]);
        acc = (lane[0] + lane[1]) + (lane[2] + lane[3]);
    }
    for (; l < k; l++) acc += fabs((double)x[l]) * fabs((double)bj0[l * bsk]);
    return acc;
}

/* The added term's entry for column j (a row of blen 1 or n values). */
static inline float bias_at(const unsigned char *bias, int bdt, int64_t blen, int64_t j) {
    return load(bias + (blen == 1 ? 0 : j) * (bdt == F32 ? 4 : 2), bdt);
}

/* Tier (a) for every column of a block, then (b) for the columns (a) left, then (c) for those (b) left: a tier's
 * sums for all of a block's columns are one sweep along B's rows when B's rows are contiguous and at least one
 * column in 16 is left (bf16 results: tier (a) clears few), else one column at a time. Returns 0 at the first
 * block with a column no tier clears, or when the scratch memory cannot be had (0 sends the caller to the full
 * check, which is always right). */
static int all_cleared(const float *s, const float *r, const float *v, const float *va, const float *b, int64_t batch,
                       int64_t groups, int64_t k, int64_t n, int64_t bsb, int64_t bsk, int64_t bsn,
                       const unsigned char *bias, int bdt, int64_t blen, int64_t rows, int64_t m, double c_r,
                       double c_v) {
    float *lw = malloc((size_t)n * sizeof(float));
    double *diffs = malloc((size_t)n * sizeof(double));
    int64_t *left = malloc((size_t)n * sizeof(int64_t));
    int ok = lw != NULL && diffs != NULL && left != NULL;
    for (int64_t bi = 0; ok && bi < batch; bi++)
        for (int64_t g = 0; ok && g < groups; g++) {
            float count = (float)(g + 1 < groups || m % rows == 0 ? rows : m % rows);
            const float *sg = s + (bi * groups + g) * n, *rg = r + (bi * groups + g) * n;
            const float *b0 = b + bi * bsb;
            int64_t nl = 0;
            for (int64_t j = 0; j < n; j++) {
                float rr = rg[j];
                if (blen) {
                    float term = count * bias_at(bias, bdt, blen, j);
                    rr = rr + term;
                }
                double size = fabs((double)rr), diff = fabs((double)sg[j] - (double)rr);
                if (size < INFINITY && diff <= size * c_r) continue; /* (a); a NaN fails */
                left[nl] = j;
                diffs[j] = diff;
                nl++;
            }
            /* (b) with L = sum_l |V_gl| |B_lj| + count |bias_j|, then (c) with M: the same with the block sums of
             * |A| (the column's magnitudes on their own). */
            for (int tier = 0; tier < 2 && nl > 0; tier++) {
                const float *x = (tier == 0 ? v : va);
                if (x == NULL) {
                    ok = 0;
                    break;
                }
                x += (bi * groups + g) * k;
                int sweep = bsn == 1 && bsk != 1 && nl * 16 >= n;
                if (sweep) row_sweep(x, b0, k, n, bsk, lw);
                int64_t still = 0;
                for (int64_t t = 0; t < nl; t++) {
                    int64_t j = left[t];
                    double bj = blen ? bias_at(bias, bdt, blen, j) : 0.0;
                    double sum = sweep ? (double)lw[j] : column_sum(x, b0 + j * bsn, k, bsk);
                    double total = sum + fabs((double)count * bj);
                    if (!(total < INFINITY && diffs[j] <= total * c_v)) left[still++] = j;
                }
                nl = still;
            }
            if (nl > 0) ok = 0;
        }
    free(lw);
    free(diffs);
    free(left);
    return ok;
}

static PyObject *py_cleared(PyObject *self, PyObject *args) {
    unsigned long long s, r, v, va, b, bias;
    int bdt;
    Py_ssize_t batch, groups, k, n, bsb, bsk, bsn, blen, rows, m;
    double c_r, c_v;
    if (!PyArg_ParseTuple(args, "KKKKKnnnn(nnn)Kinnndd", &s, &r, &v, &va, &b, &batch, &groups, &k, &n, &bsb, &bsk,
                          &bsn, &bias, &bdt, &blen, &rows, &m, &c_r, &c_v))
        return NULL;
    if ((bdt != F32 && bdt != BF16) || (blen != 0 && blen != 1 && blen != n) || rows < 1 || m < 1 || k < 1 || n < 1)
        return PyErr_Format(PyExc_ValueError, "cleared: bad bias or sizes");
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = all_cleared((const float *)(uintptr_t)s, (const float *)(uintptr_t)r, (const float *)(uintptr_t)v,
                     (const float *)(uintptr_t)va, (const float *)(uintptr_t)b, batch, groups, k, n, bsb, bsk, bsn,
                     (const unsigned char *)(uintptr_t)bias, bdt, blen, rows, m, c_r, c_v);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(ok);
}

static PyMethodDef methods[] = {
    {"block_sums", py_block_sums, METH_VARARGS,
     "block_sums(a, c, dtype, batch, m, k, n, (a strides), (c strides), rows, v, s): fp32 sums of each block of "
     "rows of A into V (batch x groups x k) and of C into S (batch x groups x n); addresses, strides in elements."},
    {"magnitude_sums", py_magnitude_sums, METH_VARARGS,
     "magnitude_sums(a, dtype, batch, m, k, (a strides), rows, va): fp32 sums of |A| over each block of rows."},
    {"cleared", py_cleared, METH_VARARGS,
     "cleared(s, r, v, va, b, batch, groups, k, n, (b strides), bias, bias_dtype, bias_len, rows, m, c_r, c_v) -> "
     "bool: every block column within c_r |R| of its reference, or c_v L, or (va not 0) c_v M: the screen's tiers."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_core",
                                    "CPU engine of the matmul checksum screen.", -1, methods};

PyMODINIT_FUNC PyInit__core(void) { return PyModule_Create(&module); }
