/* The CPU inner loop of sdcguard.fingerprint: per-chunk weighted sums SA and SB (defined in the module docstring
 * of sdcguard/fingerprint.py) over a contiguous block of 32-bit words, in one pass at memory speed.
 *
 * numpy needs five passes over each block for the same sums (two multiplies, a shift, two reductions); this loop
 * reads each word once. Built as an optional extension: without a C compiler the numpy path computes the same
 * values (the tests compare both with a pure-Python reference). The GIL is released, so independent blocks run
 * on several cores from sdcguard's thread pool.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#define SDC_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SDC_CLONES
#endif

SDC_CLONES
static void chunk_sums(const int32_t *w, Py_ssize_t n, const uint32_t *t, const uint32_t *u, Py_ssize_t chunk,
                       uint32_t *out_a, uint32_t *out_b) {
    Py_ssize_t nchunks = (n + chunk - 1) / chunk;
    for (Py_ssize_t c = 0; c < nchunks; c++) {
        const int32_t *wc = w + c * chunk;
        Py_ssize_t m = n - c * chunk;
        if (m > chunk) m = chunk;
        uint32_t sa = 0, sb = 0; /* unsigned: wraps mod 2**32, as the definition says */
        for (Py_ssize_t i = 0; i < m; i++) {
            int32_t x = wc[i];
            sa += (uint32_t)x * t[i];
            sb += (uint32_t)(x >> 16) * u[i]; /* arithmetic shift: the signed high half-word */
        }
        out_a[c] = sa;
        out_b[c] = sb;
    }
}

static int get(PyObject *obj, Py_buffer *view, int writable, const char *what) {
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) return -1;
    if (view->itemsize != 4 || view->len % 4) {
        PyErr_Format(PyExc_ValueError, "%s must be a contiguous buffer of 4-byte items", what);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *py_chunk_sums(PyObject *self, PyObject *args) {
    PyObject *ow, *ot, *ou, *oa, *ob;
    Py_ssize_t chunk;
    if (!PyArg_ParseTuple(args, "OOOnOO", &ow, &ot, &ou, &chunk, &oa, &ob)) return NULL;
    Py_buffer w, t, u, a, b;
    if (chunk <= 0) return PyErr_Format(PyExc_ValueError, "chunk must be > 0");
    if (get(ow, &w, 0, "words") < 0) return NULL;
    if (get(ot, &t, 0, "t") < 0) goto fail_w;
    if (get(ou, &u, 0, "u") < 0) goto fail_t;
    if (get(oa, &a, 1, "out_a") < 0) goto fail_u;
    if (get(ob, &b, 1, "out_b") < 0) goto fail_a;
    Py_ssize_t n = w.len / 4, nchunks = (n + chunk - 1) / chunk;
    if (t.len / 4 < chunk || u.len / 4 < chunk || a.len / 4 < nchunks || b.len / 4 < nchunks) {
        PyErr_Format(PyExc_ValueError, "weights shorter than a chunk or outputs shorter than %zd chunks", nchunks);
        goto fail_b;
    }
    Py_BEGIN_ALLOW_THREADS
    chunk_sums((const int32_t *)w.buf, n, (const uint32_t *)t.buf, (const uint32_t *)u.buf, chunk,
               (uint32_t *)a.buf, (uint32_t *)b.buf);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&b); PyBuffer_Release(&a); PyBuffer_Release(&u); PyBuffer_Release(&t); PyBuffer_Release(&w);
    Py_RETURN_NONE;
fail_b: PyBuffer_Release(&b);
fail_a: PyBuffer_Release(&a);
fail_u: PyBuffer_Release(&u);
fail_t: PyBuffer_Release(&t);
fail_w: PyBuffer_Release(&w);
    return NULL;
}

static PyMethodDef methods[] = {
    {"chunk_sums", py_chunk_sums, METH_VARARGS,
     "chunk_sums(words, t, u, chunk, out_a, out_b): SA and SB of every chunk of `chunk` words into out_a/out_b."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fpcore", "CPU inner loop of sdcguard.fingerprint.", -1,
                                    methods};

PyMODINIT_FUNC PyInit__fpcore(void) { return PyModule_Create(&module); }
