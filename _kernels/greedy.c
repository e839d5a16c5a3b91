/* The greedy choice with its confidence, for the rows a diffusion step samples (bitnet_app/decode/sampling.py
 * greedy_rows states the same maths in numpy and is the reference the tests compare with):
 *   ids[r]   = index of the largest logit of row r (the first one on ties, as numpy's argmax)
 *   probs[r] = its softmax probability = 1 / sum_i exp(x[r, i] - max), float32 exponentials summed in double
 * x: (R, V) float32 logits, row-major; banned ids are -inf in x already (they add 0 to the sum). */
#include <math.h>

#include "kernels.h"

/* The plain loop: the reference, and the path of kernel tables without max_expsum. */
static double max_expsum_ref(const float *x, int n, int *arg) {
    int a = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[a]) a = i;
    const float mx = x[a];
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += (double)expf(x[i] - mx);
    *arg = a;
    return sum;
}

void bn_greedy_rows(const bn_kernels *k, const float *x, int R, int V, int64_t *ids, double *probs) {
    double (*f)(const float *, int, int *) = k->max_expsum ? k->max_expsum : max_expsum_ref;
    for (int r = 0; r < R; r++) {
        int arg = 0;
        const double sum = f(x + (size_t)r * V, V, &arg);
        ids[r] = arg;
        probs[r] = 1.0 / sum;
    }
}
