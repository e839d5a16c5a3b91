# cython: language_level=3, boundscheck=False, wraparound=False
"""Thin Cython wrapper around the C engine (bitnet.h): builds the bn_model from the numpy views of an
EngineFile's config and tensors (no copies here: the arrays given stay referenced, see engine/resident.py for
where they live) and runs bn_forward with the GIL released."""
import numpy as np
cimport numpy as cnp
from libc.stdint cimport int8_t, int32_t, int64_t, uint8_t, uint16_t
from libc.stddef cimport size_t
from libc.stdlib cimport malloc, free

cnp.import_array()

cdef extern from "pool.h":
    int BN_POOL_MAX_THREADS

cdef extern from "bitnet.h":
    ctypedef struct bn_ternary:
        const uint8_t *codes
        const float *scale
        int n, k
    ctypedef struct bn_layer:
        const float *attn_norm
        const float *attn_sub_norm
        const float *ffn_norm
        const float *ffn_sub_norm
        bn_ternary qkv, o, gate_up, down
    ctypedef struct bn_model:
        int dim, hidden, n_layers, n_heads, n_kv_heads, head_dim, vocab, ctx
        int act
        float rope_theta, eps
        const float *rope_inv_freq
        const uint16_t *embed
        const uint16_t *head_bf16
        const float *norm
        const int8_t *head_i8
        const float *head_scale
        const int32_t *head_rowsum
        bn_layer *layers
    ctypedef struct bn_engine:
        pass
    bn_engine *bn_engine_create(const bn_model *m, int exact_head, int kv16, int n_threads, const char *isa, int ctx,
                                char *err, int errlen)
    void bn_engine_free(bn_engine *e)
    const char *bn_engine_isa(const bn_engine *e)
    int bn_engine_threads(const bn_engine *e)
    int bn_forward(bn_engine *e, const int32_t *tokens, int T, int start, int kv_end, int attention,
                   int block_size, const int32_t *rows, int n_rows, float *logits, char *err, int errlen) nogil
    int BN_PART_COUNT
    void bn_engine_set_profile(bn_engine *e, int on)
    const double *bn_engine_profile(const bn_engine *e)
    const char *bn_part_name(int part)
    double bn_read_roof_gb_s(int n_threads, size_t bytes, int passes) nogil
    int bn_engine_greedy_rows(bn_engine *e, const float *x, int R, int V, const int32_t *banned, int n_banned,
                              int64_t *ids, double *probs) nogil
    int bn_engine_sample_rows(bn_engine *e, const float *x, int R, int V, double temperature, int top_k,
                              double top_p, const double *u, const int32_t *banned, int n_banned, int64_t *ids,
                              double *probs) nogil


cdef const void *_ptr(object arr, object dtype, object shape, str name) except NULL:
    """Data pointer of a C-contiguous array after checking its dtype and shape (a bad file must not crash)."""
    if not isinstance(arr, np.ndarray):
        raise ValueError(f"engine file tensor {name} is missing")
    if arr.dtype != dtype or tuple(arr.shape) != tuple(shape) or not arr.flags.c_contiguous:
        raise ValueError(f"engine file tensor {name}: expected {np.dtype(dtype).name}{tuple(shape)}, "
                         f"got {arr.dtype.name}{tuple(arr.shape)}; convert the checkpoint again")
    return cnp.PyArray_DATA(<cnp.ndarray>arr)


def _r16(n):
    return (n + 15) // 16 * 16


cdef class CEngine:
    cdef bn_engine *e
    cdef bn_layer *layers
    cdef object keep  # the object whose arrays hold the weights (the C structs point into them)
    cdef object inv_freq  # the RoPE frequencies handed to the C engine (kept alive with it)
    cdef int vocab

    def __cinit__(self):
        self.e = NULL
        self.layers = NULL

    def __init__(self, ef, bint exact_head, bint kv16, threads, isa, int ctx):
        if not 1 <= threads <= BN_POOL_MAX_THREADS:  # checked here too: ints beyond C's range included
            raise ValueError(f"thread count {threads} is out of range: use 1 to {BN_POOL_MAX_THREADS} "
                             "(the number of CPU cores is a good choice)")
        cfg = ef.config
        t = ef.tensors
        cdef bn_model m
        cdef char err[256]
        D, I, L = int(cfg["hidden_size"]), int(cfg["intermediate_size"]), int(cfg["num_hidden_layers"])
        H, G = int(cfg["num_attention_heads"]), int(cfg["num_key_value_heads"])
        hd, V = int(cfg["head_dim"]), int(cfg["vocab_size"])
        if min(D, I, L, H, G, hd, V) <= 0:
            raise ValueError("engine file has a non-positive model dimension; convert the checkpoint again")
        m.dim, m.hidden, m.n_layers, m.n_heads, m.n_kv_heads, m.head_dim, m.vocab = D, I, L, H, G, hd, V
        m.ctx = int(cfg["max_position_embeddings"])
        m.rope_theta = float(cfg["rope_theta"])
        m.eps = float(cfg["rms_norm_eps"])
        acts = {"relu2": 0, "silu": 1}
        if cfg.get("hidden_act", "relu2") not in acts:
            raise ValueError(f"engine file has hidden_act {cfg.get('hidden_act')!r}; convert the checkpoint again")
        m.act = acts[cfg.get("hidden_act", "relu2")]
        f32, u8, i8, u16, i32 = np.float32, np.uint8, np.int8, np.uint16, np.int32
        from bitnet_app.engine.rope import rope_inv_freq
        self.inv_freq = rope_inv_freq(cfg)  # None: plain RoPE, computed by the C engine as before
        m.rope_inv_freq = NULL
        if self.inv_freq is not None:
            m.rope_inv_freq = <const float *>_ptr(self.inv_freq, f32, (hd // 2,), "rope inv_freq")
        m.embed = <const uint16_t *>_ptr(t.get("embed"), u16, (V, D), "embed")
        m.head_bf16 = m.embed
        if "lm_head" in t:  # untied head
            m.head_bf16 = <const uint16_t *>_ptr(t.get("lm_head"), u16, (V, D), "lm_head")
        m.norm = <const float *>_ptr(t.get("norm"), f32, (D,), "norm")
        m.head_i8 = <const int8_t *>_ptr(t.get("head.i8"), i8, (_r16(V) // 16, _r16(D) // 4, 64), "head.i8")
        m.head_scale = <const float *>_ptr(t.get("head.scale"), f32, (_r16(V),), "head.scale")
        m.head_rowsum = <const int32_t *>_ptr(t.get("head.rowsum"), i32, (_r16(V),), "head.rowsum")
        self.layers = <bn_layer *>malloc(sizeof(bn_layer) * L)
        if self.layers == NULL:
            raise MemoryError()
        kvd = G * hd
        shapes = {"qkv": (D + 2 * kvd, D), "o": (D, D), "gate_up": (2 * I, D), "down": (D, I)}
        cdef bn_ternary *lin
        for l in range(L):
            p = f"layers.{l}."
            self.layers[l].attn_norm = <const float *>_ptr(t.get(p + "attn_norm"), f32, (D,), p + "attn_norm")
            self.layers[l].attn_sub_norm = NULL  # absent: a layer without sub-norms (Llama family)
            if p + "attn_sub_norm" in t:
                self.layers[l].attn_sub_norm = <const float *>_ptr(t.get(p + "attn_sub_norm"), f32, (D,),
                                                                   p + "attn_sub_norm")
            self.layers[l].ffn_norm = <const float *>_ptr(t.get(p + "ffn_norm"), f32, (D,), p + "ffn_norm")
            self.layers[l].ffn_sub_norm = NULL
            if p + "ffn_sub_norm" in t:
                self.layers[l].ffn_sub_norm = <const float *>_ptr(t.get(p + "ffn_sub_norm"), f32, (I,),
                                                                  p + "ffn_sub_norm")
            for name, (n, k) in shapes.items():
                if name == "qkv":
                    lin = &self.layers[l].qkv
                elif name == "o":
                    lin = &self.layers[l].o
                elif name == "gate_up":
                    lin = &self.layers[l].gate_up
                else:
                    lin = &self.layers[l].down
                lin.n, lin.k = n, k
                lin.codes = <const uint8_t *>_ptr(t.get(p + name + ".codes"), u8, (_r16(n) // 16, _r16(k) // 16, 64), p + name + ".codes")
                lin.scale = <const float *>_ptr(t.get(p + name + ".scale"), f32, (_r16(n),), p + name + ".scale")
        m.layers = self.layers
        isa_b = (isa or "").encode()
        self.e = bn_engine_create(&m, exact_head, kv16, threads, isa_b, ctx, err, sizeof(err))
        if self.e == NULL:
            raise ValueError(err.decode(errors="replace"))
        self.keep = ef
        self.vocab = V

    def __dealloc__(self):
        if self.e != NULL:
            bn_engine_free(self.e)
        if self.layers != NULL:
            free(self.layers)

    @property
    def isa(self):
        return bn_engine_isa(self.e).decode()

    @property
    def threads(self):
        return bn_engine_threads(self.e)

    def set_profile(self, bint on):
        """Development timing (benchmarks/forward_breakdown.py): on zeroes the per-part totals and starts
        adding to them at every forward; off stops (the default, one branch per stage)."""
        bn_engine_set_profile(self.e, on)

    def profile(self):
        """{part name: seconds} added since set_profile(True); "total" is the whole C call."""
        cdef const double *p = bn_engine_profile(self.e)
        return {bn_part_name(i).decode(): p[i] for i in range(BN_PART_COUNT)}

    def forward(self, cnp.ndarray[int32_t, ndim=1, mode="c"] tokens, int start, int kv_end, int attention,
                int block_size, cnp.ndarray[int32_t, ndim=1, mode="c"] rows,
                cnp.ndarray[float, ndim=2, mode="c"] out):
        """Run one forward; logits of `rows` into out (len(rows), vocab). Raises ValueError on bad input."""
        cdef char err[256]
        cdef int rc
        cdef int T = tokens.shape[0], n_rows = rows.shape[0]
        if out.shape[0] != n_rows or out.shape[1] != self.vocab:
            raise ValueError("output array has the wrong shape")
        cdef const int32_t *tp = <const int32_t *>tokens.data
        cdef const int32_t *rp = <const int32_t *>rows.data
        cdef float *op = <float *>out.data
        with nogil:
            rc = bn_forward(self.e, tp, T, start, kv_end, attention, block_size, rp, n_rows, op, err, sizeof(err))
        if rc != 0:
            raise ValueError(err.decode(errors="replace"))

    def greedy_rows(self, cnp.ndarray[float, ndim=2, mode="c"] x, cnp.ndarray[int32_t, ndim=1, mode="c"] banned):
        """The module's greedy_rows with this engine's kernel path, the rows shared between its threads
        (rows_job.c): the same ids and probabilities."""
        cdef int R = x.shape[0], V = x.shape[1], nb = banned.shape[0]
        cdef cnp.ndarray ids, probs
        ids, probs = _rows_out(x, banned)
        if R:
            with nogil:
                bn_engine_greedy_rows(self.e, <const float *>x.data, R, V, <const int32_t *>banned.data, nb,
                                      <int64_t *>ids.data, <double *>probs.data)
        return ids, probs

    def sample_rows(self, cnp.ndarray[float, ndim=2, mode="c"] x, double temperature, int top_k, double top_p,
                    cnp.ndarray[double, ndim=1, mode="c"] u, cnp.ndarray[int32_t, ndim=1, mode="c"] banned):
        """The module's sample_rows with this engine's kernel path, the rows shared between its threads
        (rows_job.c): the same draws."""
        cdef int R = x.shape[0], V = x.shape[1], nb = banned.shape[0], rc = 0
        cdef cnp.ndarray ids, probs
        ids, probs = _draw_out(x, temperature, top_p, u, banned)
        if R:
            with nogil:
                rc = bn_engine_sample_rows(self.e, <const float *>x.data, R, V, temperature, top_k, top_p,
                                           <const double *>u.data, <const int32_t *>banned.data, nb,
                                           <int64_t *>ids.data, <double *>probs.data)
        if rc:
            raise MemoryError("out of memory sampling the logits")
        return ids, probs


# ---------------------------------------------------------------- kernel entry points for the tests

cdef extern from "kernels.h":
    ctypedef struct bn_kernels:
        const char *name
        void (*ternary_matmul)(const uint8_t *codes, int kp, const float *row_scale, const int8_t *xq,
                               const int32_t *xsum, const float *xinv, int T, int n0, int n1, float *y, int ldy) nogil
        void (*int8_matmul)(const int8_t *w, int kp, const float *row_scale, const int32_t *rowsum,
                            const int8_t *xq, const float *xinv, int T, int n0, int n1, float *y, int ldy) nogil
        void (*bf16_matmul)(const uint16_t *w, int k, const float *x, int T, int n0, int n1, float *y, int ldy) nogil
        void (*to_f16)(const float *x, uint16_t *h, int n) nogil
        float (*dot_f16)(const float *a, const uint16_t *h, int n) nogil
        void (*silu_mul)(const float *g, const float *u, float *out, int n) nogil
        double (*exp_shifted)(const double *z, double top, double *w, int n) nogil
        double (*scale_row)(const float *x, int n, double inv_t, double *z, int *n_neginf, int *n_bad) nogil
        int (*select_at_least)(const double *w, int n, double t, int *out) nogil
    const bn_kernels *bn_select_kernels(const char *force)
    void bn_greedy_rows(const bn_kernels *k, const float *x, int R, int V, const int32_t *banned, int n_banned,
                        int64_t *ids, double *probs) nogil
    int bn_sample_rows(const bn_kernels *k, const float *x, int R, int V, double temperature, int top_k, double top_p,
                       const double *u, const int32_t *banned, int n_banned, int64_t *ids, double *probs) nogil


cdef const bn_kernels *_kernels(str isa) except NULL:
    cdef const bn_kernels *k = bn_select_kernels(isa.encode())
    if k == NULL:
        raise ValueError(f"kernel path {isa!r} is not supported on this CPU")
    return k


def kernel_name(str isa=""):
    """Name of the kernel path `isa` resolves to ("" = the automatic choice)."""
    return _kernels(isa).name.decode()


def kernel_ternary(str isa, cnp.ndarray[uint8_t, ndim=3, mode="c"] codes, cnp.ndarray[float, ndim=1, mode="c"] scale,
                   cnp.ndarray[int8_t, ndim=2, mode="c"] xq):
    """Tiles (Np/16, Kp/16, 64) @ xq (T, Kp) -> (T, Np) float32, with xinv = 1 (raw scaled dot products)."""
    cdef const bn_kernels *k = _kernels(isa)
    cdef int np_ = codes.shape[0] * 16, kp = codes.shape[1] * 16, T = xq.shape[0]
    if xq.shape[1] != kp or scale.shape[0] != np_:
        raise ValueError("shape mismatch")
    xsum = np.ascontiguousarray(xq.sum(axis=1, dtype=np.int32))
    xinv = np.ones(T, dtype=np.float32)
    y = np.zeros((T, np_), dtype=np.float32)
    cdef int32_t[::1] xs = xsum
    cdef float[::1] xi = xinv
    cdef float[:, ::1] yv = y
    k.ternary_matmul(<const uint8_t *>codes.data, kp, <const float *>scale.data, <const int8_t *>xq.data,
                     &xs[0], &xi[0], T, 0, np_, &yv[0, 0], np_)
    return y


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


def kernel_silu_mul(str isa, cnp.ndarray[float, ndim=1, mode="c"] g, cnp.ndarray[float, ndim=1, mode="c"] u):
    """silu(g) * u (n,) with the path's silu_mul; None when the path has none (forward.c's plain loop runs)."""
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


cdef tuple _id_prob_rows(int R, int V):
    """For a (R, V) block of logit rows (V >= 1, else ValueError): empty ids (R,) int64 and probs (R,) float64."""
    if V < 1:
        raise ValueError("logit rows need at least one entry")
    return np.empty(R, dtype=np.int64), np.empty(R, dtype=np.float64)


cdef tuple _rows_out(cnp.ndarray x, cnp.ndarray[int32_t, ndim=1, mode="c"] banned):
    """The outputs of a greedy_rows or sample_rows call, (ids, probs), after checking the banned ids against V."""
    cdef int i, V = x.shape[1]
    out = _id_prob_rows(x.shape[0], V)
    for i in range(banned.shape[0]):
        if not 0 <= banned[i] < V or (i and banned[i] <= banned[i - 1]):
            raise ValueError(f"banned ids must be distinct, ascending and in [0, {V}); got {banned.tolist()}")
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


cdef tuple _draw_out(cnp.ndarray x, double temperature, double top_p, cnp.ndarray u, cnp.ndarray banned):
    """The outputs of a sample_rows call, (ids, probs), after checking its settings, uniforms and banned ids."""
    if u.shape[0] != x.shape[0]:
        raise ValueError("one uniform per row")
    if not temperature > 0 or not 0 < top_p <= 1:
        raise ValueError("temperature must be > 0 and top_p in (0, 1]")
    return _rows_out(x, banned)


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


def read_roof_gb_s(int threads, int megabytes=256, int passes=3):
    """GB/s that `threads` engine threads reach streaming a buffer they only read (roof.c): decode's ceiling."""
    if not 1 <= threads <= BN_POOL_MAX_THREADS or megabytes < 1 or passes < 1:
        raise ValueError("threads, megabytes and passes must be positive (threads at most the pool's limit)")
    cdef double r
    cdef size_t nbytes = <size_t>megabytes << 20
    with nogil:
        r = bn_read_roof_gb_s(threads, nbytes, passes)
    if r <= 0:
        raise MemoryError(f"could not measure the read roof with a {megabytes} MB buffer")
    return r
