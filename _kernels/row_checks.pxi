# Included by engine.pyx and engine_testing.pyx: the outputs of a greedy_rows or sample_rows call (CEngine's, and the
# tests' single-threaded ones), after checking what the C code trusts (V >= 1, the banned ids, the settings).

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


cdef tuple _draw_out(cnp.ndarray x, double temperature, double top_p, cnp.ndarray u, cnp.ndarray banned):
    """The outputs of a sample_rows call, (ids, probs), after checking its settings, uniforms and banned ids."""
    if u.shape[0] != x.shape[0]:
        raise ValueError("one uniform per row")
    if not temperature > 0 or not 0 < top_p <= 1:
        raise ValueError("temperature must be > 0 and top_p in (0, 1]")
    return _rows_out(x, banned)
