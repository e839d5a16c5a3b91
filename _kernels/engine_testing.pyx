# cython: language_level=3, boundscheck=False, wraparound=False
"""bitnet_app._engine_testing: the kernels' own entry points, for the tests (tests/test_kernels.py, test_sampling.py,
test_engine.py): one kernel of a named path (`isa`, a name of bitnet_app/engine/kernel_paths.py) on numpy arrays,
outside any forward. The product never imports it; its engine is bitnet_app._engine (engine.pyx)."""
import numpy as np
cimport numpy as cnp
from libc.math cimport sqrtf
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint16_t

cnp.import_array()

include "row_checks.pxi"

cdef extern from "kernels.h":
    ctypedef struct bn_kernels:
        const char *name
        void (*ternary_matmul)(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq,
                               const int32_t *xsum, const float *xinv, int T, int n0, int n1, float *y, int ldy) nogil
        void (*ternary5_matmul)(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq,
                                const int32_t *xsum, const float *xinv, int T, int n0, int n1, float *y, int ldy) nogil
        void (*unpack5)(const uint8_t *tiles5, int kp, int n_tiles, uint8_t *tiles2) nogil
        int trit5_windows
        void (*int8_matmul)(const int8_t *w, int kp, const float *row_scale, const int32_t *rowsum,
                            const int8_t *xq, const float *xinv, int T, int n0, int n1, float *y, int ldy) nogil
        void (*bf16_matmul)(const uint16_t *w, int k, const float *x, int T, int n0, int n1, float *y, int ldy) nogil
        void (*to_f16)(const float *x, uint16_t *h, int n) nogil
        float (*dot_f16)(const float *a, const uint16_t *h, int n) nogil
        void (*silu_mul)(const float *g, const float *u, float *out, int n) nogil
        float (*sumsq)(const float *x, int n) nogil
        float (*absmax)(const float *x, int n) nogil
        int32_t (*quantize)(const float *x, int n, int np, float scale, int8_t *q) nogil
        void (*norm_apply)(const float *x, float inv, const float *w, float *out, int n) nogil
        int32_t (*norm_quant)(const float *x, const float *w, int n, int np, float eps, float *xn, int8_t *q,
                              float *xinv) nogil
        double (*exp_shifted)(const double *z, double top, double *w, int n) nogil
        double (*scale_row)(const float *x, int n, double inv_t, double *z, int *n_neginf, int *n_bad) nogil
        int (*select_at_least)(const double *w, int n, double t, int *out) nogil
    const bn_kernels *bn_select_kernels(const char *force)
    void bn_trit5_translate(uint8_t *bytes, size_t n) nogil
    int bn_trit5_window_digit(unsigned q, int d)
    void bn_greedy_rows(const bn_kernels *k, const float *x, int R, int V, const int32_t *banned, int n_banned,
                        int64_t *ids, double *probs) nogil
    int bn_sample_rows(const bn_kernels *k, const float *x, int R, int V, double temperature, int top_k, double top_p,
                       const double *u, const int32_t *banned, int n_banned, int64_t *ids, double *probs) nogil


cdef const bn_kernels *_kernels(str isa) except NULL:
    cdef const bn_kernels *k = bn_select_kernels(isa.encode())
    if k == NULL:
        raise ValueError(f"kernel path {isa!r} is not supported on this CPU")
    return k


cdef cnp.ndarray _as_read(const bn_kernels *k, cnp.ndarray codes):
    """1.6-bit tiles as packing.py writes them -> the bytes k's kernels read: a translated copy where k reads the
    window code (as the engine translates a file's tiles when it loads them), else the same array."""
    if not k.trit5_windows:
        return codes
    out = np.array(codes, dtype=np.uint8, order="C")
    cdef uint8_t[::1] flat = out.reshape(-1)
    if flat.shape[0]:
        bn_trit5_translate(&flat[0], flat.shape[0])
    return out


cdef object _ternary(const bn_kernels *k, bint five, cnp.ndarray codes, cnp.ndarray scale, cnp.ndarray xq):
    """y (T, Np) of the 2-bit (five false) or 1.6-bit kernel, with xinv = 1; shapes checked by the callers."""
    cdef int np_ = codes.shape[0] * 16, kp = xq.shape[1], T = xq.shape[0]
    xsum = np.ascontiguousarray(xq.sum(axis=1, dtype=np.int32))
    xinv = np.ones(T, dtype=np.float32)
    y = np.zeros((T, np_), dtype=np.float32)
    cdef int32_t[::1] xs = xsum
    cdef float[::1] xi = xinv
    cdef float[:, ::1] yv = y
    if five:
        k.ternary5_matmul(<const uint8_t *>codes.data, kp, <const float *>scale.data, <const int8_t *>xq.data,
                          &xs[0], &xi[0], T, 0, np_, &yv[0, 0], np_)
    else:
        k.ternary_matmul(<const uint8_t *>codes.data, kp, <const float *>scale.data, <const int8_t *>xq.data,
                         &xs[0], &xi[0], T, 0, np_, &yv[0, 0], np_)
    return y


def kernel_ternary(str isa, cnp.ndarray[uint8_t, ndim=3, mode="c"] codes, cnp.ndarray[float, ndim=1, mode="c"] scale,
                   cnp.ndarray[int8_t, ndim=2, mode="c"] xq):
    """Tiles (Np/16, Kp/16, 64) @ xq (T, Kp) -> (T, Np) float32, with xinv = 1 (raw scaled dot products)."""
    if xq.shape[1] != codes.shape[1] * 16 or scale.shape[0] != codes.shape[0] * 16:
        raise ValueError("shape mismatch")
    return _ternary(_kernels(isa), False, codes, scale, xq)


def kernel_ternary5(str isa, cnp.ndarray[uint8_t, ndim=3, mode="c"] codes, cnp.ndarray[float, ndim=1, mode="c"] scale,
                    cnp.ndarray[int8_t, ndim=2, mode="c"] xq, bint as_read=False):
    """1.6-bit tiles (Np/16, G5, 64) @ xq (T, Kp) -> (T, Np) float32, xinv = 1: kernel_ternary's numbers from the
    other layout. The tiles as packing.py writes them, translated for a path that reads the window code; as_read:
    already in the bytes the path reads (codes_as_read's, for timing the kernel alone)."""
    cdef int kp = xq.shape[1]
    if kp % 16 or codes.shape[1] != (kp // 4 + 4) // 5 or scale.shape[0] != codes.shape[0] * 16:
        raise ValueError("shape mismatch")
    cdef const bn_kernels *k = _kernels(isa)
    return _ternary(k, True, codes if as_read else _as_read(k, codes), scale, xq)


def codes_as_read(str isa, cnp.ndarray[uint8_t, ndim=3, mode="c"] codes):
    """1.6-bit tiles as packing.py writes them -> the bytes the path `isa` reads (a copy where it reads the window
    code, else the same array)."""
    return _as_read(_kernels(isa), codes)


def kernel_unpack5(str isa, cnp.ndarray[uint8_t, ndim=3, mode="c"] codes, int kp):
    """1.6-bit tiles (Np/16, G5, 64) of padded width kp -> the 2-bit tiles (Np/16, kp/16, 64) of the same weights."""
    cdef const bn_kernels *k = _kernels(isa)
    if kp <= 0 or kp % 16 or codes.shape[1] != (kp // 4 + 4) // 5:
        raise ValueError("shape mismatch")
    out = np.zeros((codes.shape[0], kp // 16, 64), dtype=np.uint8)
    cdef uint8_t[:, :, ::1] ov = out
    codes = _as_read(k, codes)
    if codes.shape[0]:
        k.unpack5(<const uint8_t *>codes.data, kp, codes.shape[0], &ov[0, 0, 0])
    return out


def trit5_window_digits():
    """The five codes of each of the 256 bytes of the window code (_kernels/trit5_windows.c): uint8 (256, 5)."""
    out = np.zeros((256, 5), dtype=np.uint8)
    for q in range(256):
        for d in range(5):
            out[q, d] = bn_trit5_window_digit(q, d)
    return out


def kernel_int8(str isa, cnp.ndarray[int8_t, ndim=3, mode="c"] w, cnp.ndarray[float, ndim=1, mode="c"] scale,
                cnp.ndarray[int32_t, ndim=1, mode="c"] rowsum, cnp.ndarray[int8_t, ndim=2, mode="c"] xq):
    """Int8 tiles (Np/16, Kp/4, 64) @ xq (T, Kp) -> (T, Np) float32, xinv = 1."""
    cdef const bn_kernels *k = _kernels(isa)
    cdef int np_ = w.shape[0] * 16, kp = w.shape[1] * 4, T = xq.shape[0]
    if xq.shape[1] != kp or scale.shape[0] != np_ or rowsum.shape[0] != np_:
        raise ValueError("shape mismatch")
    xinv = np.ones(T, dtype=np.float32)
    y = np.zeros((T, np_), dtype=np.float32)
    cdef float[::1] xi = xinv
    cdef float[:, ::1] yv = y
    k.int8_matmul(<const int8_t *>w.data, kp, <const float *>scale.data, <const int32_t *>rowsum.data,
                  <const int8_t *>xq.data, &xi[0], T, 0, np_, &yv[0, 0], np_)
    return y


def kernel_bf16(str isa, cnp.ndarray[uint16_t, ndim=2, mode="c"] w, cnp.ndarray[float, ndim=2, mode="c"] x):
    """bf16 W (N, K) @ x (T, K) float32 -> (T, N) float32."""
    cdef const bn_kernels *k = _kernels(isa)
    cdef int n = w.shape[0], kk = w.shape[1], T = x.shape[0]
    if x.shape[1] != kk:
        raise ValueError("shape mismatch")
    y = np.zeros((T, n), dtype=np.float32)
    cdef float[:, ::1] yv = y
    k.bf16_matmul(<const uint16_t *>w.data, kk, <const float *>x.data, T, 0, n, &yv[0, 0], n)
    return y


def kernel_to_f16(str isa, cnp.ndarray[float, ndim=1, mode="c"] x):
    """float32 (n,) -> IEEE half bits uint16 (n,) with the KV cache's conversion."""
    cdef const bn_kernels *k = _kernels(isa)
    h = np.zeros(x.shape[0], dtype=np.uint16)
    cdef uint16_t[::1] hv = h
    if x.shape[0]:
        k.to_f16(<const float *>x.data, &hv[0], x.shape[0])
    return h


def kernel_dot_f16(str isa, cnp.ndarray[float, ndim=1, mode="c"] a, cnp.ndarray[uint16_t, ndim=1, mode="c"] h):
    cdef const bn_kernels *k = _kernels(isa)
    if a.shape[0] != h.shape[0]:
        raise ValueError("shape mismatch")
    return k.dot_f16(<const float *>a.data, <const uint16_t *>h.data, a.shape[0])


def kernel_norm_quant(str isa, cnp.ndarray[float, ndim=1, mode="c"] x, cnp.ndarray[float, ndim=1, mode="c"] w,
                      int np_, float eps, bint fused):
    """quant8(rmsnorm(x) * w) of one row (n,) -> (q int8 (np_,), sum(q), 1/scale): through the path's fused
    norm_quant (fused true; None when the path has none), or composed from its sumsq, norm_apply, absmax and
    quantize as layer.c composes them (fused false)."""
    cdef const bn_kernels *k = _kernels(isa)
    cdef int n = x.shape[0]
    if w.shape[0] != n or n == 0 or np_ < n or np_ % 16:
        raise ValueError("shape mismatch")
    if fused and k.norm_quant == NULL:
        return None
    q = np.zeros(np_, dtype=np.int8)
    xn = np.zeros(n, dtype=np.float32)
    cdef int8_t[::1] qv = q
    cdef float[::1] xnv = xn
    cdef float xinv, m, inv, scale, one = 1.0, c127 = 127.0, nf = n  # float maths, as layer.c's
    cdef int32_t total
    if fused:
        total = k.norm_quant(<const float *>x.data, <const float *>w.data, n, np_, eps, &xnv[0], &qv[0], &xinv)
    else:
        inv = one / sqrtf(k.sumsq(<const float *>x.data, n) / nf + eps)
        k.norm_apply(<const float *>x.data, inv, <const float *>w.data, &xnv[0], n)
        m = k.absmax(&xnv[0], n)
        if m < 1e-5:
            m = 1e-5
        scale = c127 / m
        total = k.quantize(&xnv[0], n, np_, scale, &qv[0])
        xinv = one / scale
    return q, int(total), float(xinv)


def kernel_silu_mul(str isa, cnp.ndarray[float, ndim=1, mode="c"] g, cnp.ndarray[float, ndim=1, mode="c"] u):
    """silu(g) * u (n,) with the path's silu_mul; None when the path has none (kernels_fallback.c's loop runs)."""
    cdef const bn_kernels *k = _kernels(isa)
    if k.silu_mul == NULL:
        return None
    if g.shape[0] != u.shape[0]:
        raise ValueError("shape mismatch")
    out = np.zeros(g.shape[0], dtype=np.float32)
    cdef float[::1] ov = out
    if g.shape[0]:
        k.silu_mul(<const float *>g.data, <const float *>u.data, &ov[0], g.shape[0])
    return out


def greedy_rows(str isa, cnp.ndarray[float, ndim=2, mode="c"] x, cnp.ndarray[int32_t, ndim=1, mode="c"] banned):
    """(R, V) float32 logits -> argmax ids (R,) int64 and their softmax probabilities (R,) float64, with the
    kernel path `isa` and the ids `banned` (ascending, distinct, in [0, V)) taken as -inf (greedy.c;
    decode/sampling.py greedy_rows is the numpy reference). x is left alone. One thread: CEngine.greedy_rows
    shares the rows between an engine's threads."""
    cdef const bn_kernels *k = _kernels(isa)
    cdef int R = x.shape[0], V = x.shape[1], nb = banned.shape[0]
    cdef cnp.ndarray ids, probs
    ids, probs = _rows_out(x, banned)
    if R:
        with nogil:
            bn_greedy_rows(k, <const float *>x.data, R, V, <const int32_t *>banned.data, nb, <int64_t *>ids.data,
                           <double *>probs.data)
    return ids, probs


def exp_shifted(str isa, cnp.ndarray[double, ndim=1, mode="c"] z, double top):
    """(exp(z - top), their sum) (float64) with the kernel path `isa`'s vector exponential; None where it has none
    (sample.c then uses libm's)."""
    cdef const bn_kernels *k = _kernels(isa)
    if k.exp_shifted == NULL:
        return None
    cdef cnp.ndarray[double, ndim=1, mode="c"] w = np.empty_like(z)
    cdef double total
    with nogil:
        total = k.exp_shifted(<const double *>z.data, top, <double *>w.data, z.shape[0])
    return w, total


NO_IDS = np.zeros(0, dtype=np.int32)


def sample_rows(str isa, cnp.ndarray[float, ndim=2, mode="c"] x, double temperature, int top_k, double top_p,
                cnp.ndarray[double, ndim=1, mode="c"] u, cnp.ndarray[int32_t, ndim=1, mode="c"] banned=NO_IDS):
    """(R, V) float32 logits -> one draw per row after temperature, top-k and top-p with the uniforms u (R,), the
    ids `banned` (ascending, distinct, in [0, V)) taken as -inf: ids (R,) int64 and their probabilities (R,) float64,
    with the kernel path `isa` (sample.c; decode/sampling.py Sampler._draw is the numpy reference). x is left
    alone. One thread: CEngine.sample_rows shares the rows between an engine's threads."""
    cdef const bn_kernels *k = _kernels(isa)
    cdef int R = x.shape[0], V = x.shape[1], nb = banned.shape[0], rc = 0
    cdef cnp.ndarray ids, probs
    ids, probs = _draw_out(x, temperature, top_p, u, banned)
    if R:
        with nogil:
            rc = bn_sample_rows(k, <const float *>x.data, R, V, temperature, top_k, top_p, <const double *>u.data,
                                <const int32_t *>banned.data, nb, <int64_t *>ids.data, <double *>probs.data)
    if rc:
        raise MemoryError("out of memory sampling the logits")
    return ids, probs
