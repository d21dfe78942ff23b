/* The CPU engine of sdcguard.fingerprint: the per-chunk weighted sums SA and SB and the mixed chunk terms
 * (definitions in the module docstring of sdcguard/fingerprints/definition.py), in one pass at memory speed.
 *
 * partials(runs, t, u, chunk) takes a flat uint64 buffer of (address, nbytes, c0) triples: each a run of whole
 * chunks of raw bytes in memory, starting at chunk index c0 of its tensor (the last run of a tensor may end in a
 * partial chunk and a partial word, zero-padded as the definition says). For each it returns
 * sum_c mix(V_c + c*PHI + SEED) mod 2**64 over its chunks; the caller adds the runs of one tensor and applies
 * the final mix. copy_partials(runs, t, u, chunk) does the same for (source, destination, nbytes, c0) tuples and
 * copies each run to its destination in the same pass (a checkpoint's staging copy and its fingerprints in one read
 * of the state). One call handles any number of tensors, so a model's hundreds of small parameters cost one
 * call, not hundreds of numpy operations each. Addresses rather than buffer objects, because torch tensors do
 * not export the buffer protocol: the caller keeps the memory alive for the call. Words are read with memcpy,
 * so no alignment is needed. The GIL is released for the arithmetic, so runs can be shared out to threads.
 *
 * Built as an optional extension: without a C compiler numpy computes the same values (the tests compare both
 * with a pure-Python reference).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define SDC_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SDC_CLONES
#endif

#define PHI 0x9E3779B97F4A7C15ull
#define SEED 0x5D6C9A2B3F17E4C1ull

static inline uint64_t mix64(uint64_t z) { /* splitmix64 finalizer */
    z ^= z >> 30;
    z *= 0xBF58476D1CE4E5B9ull;
    z ^= z >> 27;
    z *= 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* The mixed terms of the chunks of `nbytes` bytes at `p`, the first being chunk c0. */
SDC_CLONES
static uint64_t run_partial(const unsigned char *p, uint64_t nbytes, const uint32_t *t, const uint32_t *u,
                            uint64_t chunk, uint64_t c0) {
    uint64_t nwords = nbytes / 4, tail = nbytes % 4, acc = 0, c = c0;
    for (uint64_t s = 0; s < nwords || (s == nwords && tail); s += chunk, c++) {
        uint64_t m = nwords - s < chunk ? nwords - s : chunk;
        uint32_t sa = 0, sb = 0; /* unsigned: wraps mod 2**32, as the definition says */
        const unsigned char *pc = p + 4 * s;
        for (uint64_t i = 0; i < m; i++) {
            int32_t x;
            memcpy(&x, pc + 4 * i, 4); /* an unaligned load where needed; vectorized like a plain one */
            sa += (uint32_t)x * t[i];
            sb += (uint32_t)(x >> 16) * u[i]; /* arithmetic shift: the signed high half-word */
        }
        if (m < chunk && tail) { /* the last, partial word, zero-padded; it lies in this chunk */
            int32_t x = 0;
            memcpy(&x, p + 4 * nwords, (size_t)tail);
            sa += (uint32_t)x * t[m];
            sb += (uint32_t)(x >> 16) * u[m];
            tail = 0;
        }
        acc += mix64(((uint64_t)sa | ((uint64_t)sb << 32)) + c * PHI + SEED);
    }
    return acc;
}

/* run_partial of the `nbytes` bytes at `src`, copying them to `dst` in the same pass: each word is loaded once,
 * added into the sums and stored, so the fingerprint is of the source's bytes as the copy read them (a store that
 * goes wrong shows in a later fingerprint of `dst`). The partial last word is copied byte by byte. */
SDC_CLONES
static uint64_t copy_run_partial(unsigned char *dst, const unsigned char *src, uint64_t nbytes, const uint32_t *t,
                                 const uint32_t *u, uint64_t chunk, uint64_t c0) {
    uint64_t nwords = nbytes / 4, tail = nbytes % 4, acc = 0, c = c0;
    for (uint64_t s = 0; s < nwords || (s == nwords && tail); s += chunk, c++) {
        uint64_t m = nwords - s < chunk ? nwords - s : chunk;
        uint32_t sa = 0, sb = 0;
        const unsigned char *pc = src + 4 * s;
        unsigned char *qc = dst + 4 * s;
        for (uint64_t i = 0; i < m; i++) {
            int32_t x;
            memcpy(&x, pc + 4 * i, 4);
            memcpy(qc + 4 * i, &x, 4);
            sa += (uint32_t)x * t[i];
            sb += (uint32_t)(x >> 16) * u[i];
        }
        if (m < chunk && tail) {
            int32_t x = 0;
            memcpy(&x, src + 4 * nwords, (size_t)tail);
            memcpy(dst + 4 * nwords, &x, (size_t)tail);
            sa += (uint32_t)x * t[m];
            sb += (uint32_t)(x >> 16) * u[m];
            tail = 0;
        }
        acc += mix64(((uint64_t)sa | ((uint64_t)sb << 32)) + c * PHI + SEED);
    }
    return acc;
}

static int get_table(PyObject *obj, Py_buffer *view, Py_ssize_t chunk, const char *what) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (view->len < 4 * chunk || ((uintptr_t)view->buf & 3)) {
        PyErr_Format(PyExc_ValueError, "%s must be an aligned buffer of at least `chunk` 32-bit words", what);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

/* partials(runs, ...) and copy_partials(runs, ...): one parser, `width` uint64 words per run. */
static PyObject *run_all(PyObject *args, int copy) {
    PyObject *oruns, *ot, *ou, *result = NULL;
    Py_ssize_t chunk, width = copy ? 4 : 3;
    Py_buffer runs, t, u;
    if (!PyArg_ParseTuple(args, "OOOn", &oruns, &ot, &ou, &chunk)) return NULL;
    if (chunk <= 0) return PyErr_Format(PyExc_ValueError, "chunk must be > 0");
    if (PyObject_GetBuffer(oruns, &runs, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (runs.len % (8 * width) || (runs.len && ((uintptr_t)runs.buf & 7))) {
        PyErr_Format(PyExc_ValueError, "runs must be an aligned buffer of %s uint64 tuples",
                     copy ? "(source, destination, nbytes, c0)" : "(address, nbytes, c0)");
        goto done_runs;
    }
    if (get_table(ot, &t, chunk, "t") < 0) goto done_runs;
    if (get_table(ou, &u, chunk, "u") < 0) goto done_t;
    Py_ssize_t n = runs.len / (8 * width);
    uint64_t *out = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(uint64_t));
    if (out == NULL) {
        PyErr_NoMemory();
        goto done_u;
    }
    const uint64_t *r = (const uint64_t *)runs.buf;
    const uint32_t *tt = (const uint32_t *)t.buf, *uu = (const uint32_t *)u.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < n; k++) {
        const uint64_t *q = r + width * k;
        out[k] = copy ? copy_run_partial((unsigned char *)(uintptr_t)q[1], (const unsigned char *)(uintptr_t)q[0],
                                         q[2], tt, uu, (uint64_t)chunk, q[3])
                      : run_partial((const unsigned char *)(uintptr_t)q[0], q[1], tt, uu, (uint64_t)chunk, q[2]);
    }
    Py_END_ALLOW_THREADS
    result = PyList_New(n);
    for (Py_ssize_t k = 0; result != NULL && k < n; k++) {
        PyObject *v = PyLong_FromUnsignedLongLong((unsigned long long)out[k]);
        if (v == NULL) Py_CLEAR(result);
        else PyList_SET_ITEM(result, k, v);
    }
    PyMem_Free(out);
done_u:
    PyBuffer_Release(&u);
done_t:
    PyBuffer_Release(&t);
done_runs:
    PyBuffer_Release(&runs);
    return result;
}

static PyObject *py_partials(PyObject *self, PyObject *args) { return run_all(args, 0); }

static PyObject *py_copy_partials(PyObject *self, PyObject *args) { return run_all(args, 1); }

static PyMethodDef methods[] = {
    {"partials", py_partials, METH_VARARGS,
     "partials(runs, t, u, chunk) -> list[int]: for each (address, nbytes, c0) uint64 triple in runs, the sum "
     "mod 2**64 of the mixed terms mix(V_c + c*PHI + SEED) of its chunks, numbered from c0."},
    {"copy_partials", py_copy_partials, METH_VARARGS,
     "copy_partials(runs, t, u, chunk) -> list[int]: for each (source, destination, nbytes, c0) uint64 tuple, "
     "copies nbytes from source to destination and returns what partials returns for the source, in one pass."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fpcore", "CPU engine of sdcguard.fingerprint.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__fpcore(void) { return PyModule_Create(&module); }
