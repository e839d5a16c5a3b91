/* The greedy choice with its confidence, for the rows a diffusion step samples (bitnet_app/decode/sampling.py
 * greedy_rows states the same maths in numpy and is the reference the tests compare with):
 *   ids[r]   = index of the largest logit of row r (the first one on ties, as numpy's argmax)
 *   probs[r] = its softmax probability = 1 / sum_i exp(x[r, i] - max), float32 exponentials summed in double
 * x: (R, V) float32 logits, row-major, left alone. The banned ids (the mask token) count as -inf: each row is taken
 * as the runs between them, so nothing is copied. */
#include <math.h>

#include "kernels.h"

void bn_greedy_rows(const bn_kernels *k, const float *x, int R, int V, const int32_t *banned, int n_banned,
                    int64_t *ids, double *probs) {
    float (*max_first)(const float *, int, int *) = k->max_first ? k->max_first : bn_fallback_max_first;
    double (*expsum)(const float *, int, float) = k->expsum ? k->expsum : bn_fallback_expsum;
    for (int r = 0; r < R; r++) {
        const float *row = x + (size_t)r * V;
        int best = -1;
        float mx = -INFINITY;
        for (int b = 0, a = 0; b <= n_banned; a = b < n_banned ? banned[b] + 1 : V, b++) { /* runs [a, end) */
            const int end = b < n_banned ? banned[b] : V;
            if (end <= a) continue;
            int arg;
            const float m = max_first(row + a, end - a, &arg);
            if (best < 0 || m > mx) { /* a later run wins only by being larger: the first on ties */
                mx = m;
                best = a + arg;
            }
        }
        double sum = 0.0;
        for (int b = 0, a = 0; b <= n_banned; a = b < n_banned ? banned[b] + 1 : V, b++) {
            const int end = b < n_banned ? banned[b] : V;
            if (end > a) sum += expsum(row + a, end - a, mx);
        }
        ids[r] = best < 0 ? 0 : best; /* every id banned: id 0, probability NaN (numpy's all -inf row) */
        probs[r] = best < 0 ? NAN : 1.0 / sum;
    }
}
