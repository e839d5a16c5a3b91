# cython: language_level=3, boundscheck=False, wraparound=False
"""bitnet_app._engine: the thin Cython wrapper around the C engine (bitnet.h). CEngine builds the bn_model from the
numpy views of an EngineFile's config and tensors (no copies here: the arrays given stay referenced, see
engine/resident.py for where they live) and runs bn_forward with the GIL released; bitnet_app/engine/runtime.py
(Engine) is its Python face. Also: the kernel paths the dispatcher knows (kernel_paths, kernel_name) and the
machine's read roof (read_roof_gb_s). The kernels' own entry points, for the tests, are a module of their own
(engine_testing.pyx: bitnet_app._engine_testing)."""
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
        int packing
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
    bn_engine *bn_engine_create(const bn_model *m, int exact_head, int kv, int n_threads, const char *isa, int ctx,
                                char *err, int errlen)
    void bn_engine_free(bn_engine *e)
    const char *bn_engine_isa(const bn_engine *e)
    int bn_engine_threads(const bn_engine *e)
    int bn_forward(bn_engine *e, const int32_t *tokens, int T, int start, int kv_end, int attention,
                   int block_size, const int32_t *rows, int n_rows, float *logits, char *err, int errlen) nogil
    int bn_forward_serial_oracle(bn_engine *e, const int32_t *tokens, int T, int start, int kv_end, int attention,
                                 int block_size, const int32_t *rows, int n_rows, float *logits, char *err,
                                 int errlen) nogil
    int bn_all_finite(const float *x, size_t n) nogil
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


include "row_checks.pxi"


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

    def __init__(self, ef, bint exact_head, int kv, threads, isa, int ctx):
        """kv: the KV cache's element type, enum bn_kv (0 float32, 1 fp16, 2 int8 with a scale per row)."""
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
        from bitnet_app.engine.packing import PACKINGS, ternary_tile_shape
        packing = getattr(ef, "packing", PACKINGS[0])
        if packing not in PACKINGS:
            raise ValueError(f"engine file has ternary packing {packing!r}; convert the checkpoint again")
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
                lin.n, lin.k, lin.packing = n, k, PACKINGS.index(packing)
                lin.codes = <const uint8_t *>_ptr(t.get(p + name + ".codes"), u8, ternary_tile_shape(n, k, packing),
                                                  p + name + ".codes")
                lin.scale = <const float *>_ptr(t.get(p + name + ".scale"), f32, (_r16(n),), p + name + ".scale")
        m.layers = self.layers
        isa_b = (isa or "").encode()
        self.e = bn_engine_create(&m, exact_head, kv, threads, isa_b, ctx, err, sizeof(err))
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
                cnp.ndarray[float, ndim=2, mode="c"] out, bint serial=False):
        """Run one forward; logits of `rows` into out (len(rows), vocab). Returns whether they are all finite (a
        damaged file's NaN or infinity: the caller says so). Raises ValueError on bad input. serial: through the
        plain serial C forward on the calling thread (forward.c: the scheduler's oracle, for the tests)."""
        cdef char err[256]
        cdef int rc
        cdef int T = tokens.shape[0], n_rows = rows.shape[0]
        if out.shape[0] != n_rows or out.shape[1] != self.vocab:
            raise ValueError("output array has the wrong shape")
        cdef const int32_t *tp = <const int32_t *>tokens.data
        cdef const int32_t *rp = <const int32_t *>rows.data
        cdef float *op = <float *>out.data
        cdef int finite = 1
        with nogil:
            if serial:
                rc = bn_forward_serial_oracle(self.e, tp, T, start, kv_end, attention, block_size, rp, n_rows, op,
                                              err, sizeof(err))
            else:
                rc = bn_forward(self.e, tp, T, start, kv_end, attention, block_size, rp, n_rows, op, err, sizeof(err))
            if rc == 0:
                finite = bn_all_finite(op, <size_t>n_rows * self.vocab)
        if rc != 0:
            raise ValueError(err.decode(errors="replace"))
        return bool(finite)

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


# ---------------------------------------------------------------- kernel paths and the read roof

cdef extern from "kernels.h":
    ctypedef struct bn_kernels:
        const char *name
        int trit5_windows
    const bn_kernels *bn_select_kernels(const char *force)
    const char *bn_kernel_path_name(int i)
    void bn_trit5_translate(uint8_t *bytes, size_t n) nogil


def kernel_paths():
    """Every kernel path's name, in the dispatcher's order of preference (_kernels/dispatch.c PATHS; the emulated
    ones last). bitnet_app/engine/kernel_paths.py lists the same names with their labels."""
    names = []
    while bn_kernel_path_name(len(names)) != NULL:
        names.append(bn_kernel_path_name(len(names)).decode())
    return tuple(names)


def kernel_name(str isa=""):
    """Name of the kernel path `isa` resolves to ("" = the automatic choice); ValueError if this CPU has none."""
    cdef const bn_kernels *k = bn_select_kernels(isa.encode())
    if k == NULL:
        raise ValueError(f"kernel path {isa!r} is not supported on this CPU (or unknown)")
    return k.name.decode()


def reads_trit5_windows(str isa=""):
    """Whether the kernel path `isa` resolves to reads 1.6-bit tiles in the window code (_kernels/trit5_windows.c),
    so that an engine on it needs the file's tiles translated (translate_trit5) first. False for a path this CPU
    cannot run (the engine then says so)."""
    cdef const bn_kernels *k = bn_select_kernels(isa.encode())
    return k != NULL and bool(k.trit5_windows)


def translate_trit5(uint8_t[::1] codes):
    """1.6-bit tile bytes as the engine file holds them -> the window code, in place (a byte table: 0.23 s for the
    417 MB of a 2B model's tiles on Zen 4)."""
    if codes.shape[0]:
        with nogil:
            bn_trit5_translate(&codes[0], codes.shape[0])


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


# ---------------------------------------------------------------- value checks of an engine file (engine/values.py)

def int8_tile_rowsums(const int8_t[:, :, ::1] tiles):
    """Int8 head tiles (Vp/16, Dp/4, 64), byte [t, g, 4*i + j] = w8[16*t + i, 4*g + j] (packing.pack_int8_tiles)
    -> the sum of each row of w8, int32 (Vp,): what head.rowsum must hold. One pass over the bytes, the 64 lanes of
    a tile summed side by side (the compiler vectorizes it): ~10x numpy's sum over a strided axis."""
    cdef Py_ssize_t n_tiles = tiles.shape[0], groups = tiles.shape[1], t, g, k
    out = np.zeros(n_tiles * 16, dtype=np.int32)
    cdef int32_t[::1] sums = out
    cdef int32_t acc[64]
    if tiles.shape[2] != 64:
        raise ValueError("int8 tiles have 64 bytes per group")
    with nogil:
        for t in range(n_tiles):
            for k in range(64):
                acc[k] = 0
            for g in range(groups):
                for k in range(64):
                    acc[k] += tiles[t, g, k]
            for k in range(64):
                sums[16 * t + k // 4] += acc[k]
    return out
