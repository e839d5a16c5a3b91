/* The window code: how the AVX-512 kernels with VBMI and GFNI hold 1.6-bit tiles in memory (kernels.h).
 *
 * The engine file's 1.6-bit bytes (packing.py: q = ceil(256 v / 243)) give each of their five codes only through
 * all eight bits (c_d = 3 t_d >> 8, t_d = q 3^d mod 256), so a decode spends two vpdpbusd a digit on them. The
 * window code is another one-to-one map of the 243 digit tuples to bytes, built so that every code is a lookup in a
 * 128-entry table (one vpermi2b, which reads the low 7 bits of each index byte) of 7 of the byte's 8 bits:
 *   c0, c1 = PAIRS_LOW[q & 127] / 3, % 3        (bit 7 left out)
 *   c2, c3 = PAIRS_HIGH[q >> 1] / 3, % 3        (bit 0 left out)
 *   c4     = LAST[q without bit 2]              (bits 0, 1, 3..7 moved down: one gf2p8affineqb)
 * so a 64-byte group costs one shift, one bit gather, five lookups and five vpdpbusd (kernels_avx512.c).
 * Two codes can share a 7-bit window only while each of the 9 pairs finds 27 bytes among 128 x 2, and no three can,
 * hence the third window. The tables were found by a randomized search (each of the 81 cells of (c0 c1, c2 c3) given
 * at least three bytes), then a small SAT problem for LAST (each cell's bytes taking all three values of c4, with
 * bit 2 ignored): tools/find_trit5_code.py prints them. 13 of the 256 bytes are spare. tests/test_packing.py checks
 * that every tuple has a byte and that each code depends on its window alone.
 *
 * The engine translates a file's 1.6-bit tiles into this code once, when it loads them for such a path
 * (bn_trit5_translate, called through engine.pyx from engine/runtime.py), so the file format stays as it is.
 */
#include <pthread.h>

#include "kernels.h"

/* c0 * 3 + c1 by q & 127 */
const uint8_t bn_trit5_pairs_low[128] = {
    7, 3, 6, 8, 3, 8, 3, 4, 0, 7, 5, 1, 4, 5, 0, 4, 5, 2, 3, 1, 8, 1, 8, 5, 5, 4, 1, 6, 7, 5, 2, 1,
    7, 0, 8, 0, 3, 8, 2, 0, 4, 2, 6, 0, 2, 7, 6, 8, 7, 5, 2, 8, 2, 1, 2, 6, 2, 1, 0, 0, 3, 7, 2, 7,
    2, 1, 5, 8, 3, 7, 3, 6, 0, 8, 5, 1, 1, 7, 8, 0, 3, 5, 8, 1, 0, 6, 7, 6, 4, 5, 3, 2, 4, 0, 5, 1,
    7, 1, 6, 2, 0, 0, 8, 4, 6, 3, 3, 4, 6, 6, 5, 6, 7, 0, 4, 4, 8, 5, 3, 6, 2, 1, 4, 8, 4, 3, 7, 4};

/* c2 * 3 + c3 by q >> 1 */
const uint8_t bn_trit5_pairs_high[128] = {
    8, 7, 6, 7, 3, 1, 4, 5, 8, 5, 2, 8, 8, 6, 6, 2, 0, 1, 0, 4, 2, 5, 5, 3, 5, 7, 4, 4, 7, 7, 4, 3,
    8, 7, 1, 3, 6, 0, 7, 0, 7, 5, 5, 7, 1, 3, 7, 4, 3, 2, 8, 8, 8, 0, 6, 0, 2, 1, 5, 4, 6, 6, 8, 0,
    6, 0, 5, 2, 8, 3, 3, 4, 0, 1, 4, 4, 5, 2, 8, 5, 0, 7, 3, 3, 6, 8, 1, 5, 2, 1, 8, 7, 7, 1, 2, 5,
    0, 6, 7, 1, 2, 6, 1, 3, 2, 8, 3, 0, 7, 6, 2, 3, 4, 1, 6, 2, 8, 0, 1, 2, 4, 3, 1, 4, 0, 4, 5, 6};

/* c4 by (q & 3) | (q >> 3) << 2 */
const uint8_t bn_trit5_last[128] = {
    0, 0, 1, 2, 0, 0, 0, 2, 0, 2, 1, 1, 2, 0, 2, 0, 1, 2, 0, 2, 2, 0, 2, 1, 2, 0, 1, 1, 0, 0, 0, 1,
    0, 0, 1, 0, 1, 1, 0, 1, 2, 0, 2, 0, 0, 2, 2, 1, 2, 1, 0, 1, 2, 1, 2, 0, 0, 1, 1, 2, 2, 1, 2, 2,
    0, 1, 2, 1, 1, 1, 0, 2, 1, 2, 2, 1, 2, 0, 1, 2, 0, 0, 2, 2, 1, 1, 1, 0, 1, 2, 2, 2, 0, 2, 0, 1,
    0, 0, 1, 2, 0, 2, 2, 0, 1, 1, 2, 1, 1, 2, 2, 0, 2, 0, 1, 0, 0, 2, 0, 1, 1, 1, 2, 0, 1, 2, 1, 0};

static inline unsigned window_digit(unsigned q, int d) {
    switch (d) {
        case 0: return bn_trit5_pairs_low[q & 127] / 3;
        case 1: return bn_trit5_pairs_low[q & 127] % 3;
        case 2: return bn_trit5_pairs_high[q >> 1] / 3;
        case 3: return bn_trit5_pairs_high[q >> 1] % 3;
        default: return bn_trit5_last[(q & 3) | (q >> 3) << 2];
    }
}

/* file byte -> window byte, built once: the digits the file's code gives any byte (packing.py decode_trits: the 13
 * bytes that encode_trits never writes decode to some tuple too, and are mapped to it, so a damaged file reads the
 * same on every path), then the first window byte with those digits */
static uint8_t to_window[256];
static pthread_once_t to_window_once = PTHREAD_ONCE_INIT;
static void build_to_window(void) {
    int byte_of[243];
    for (int v = 0; v < 243; v++) byte_of[v] = -1;
    for (unsigned w = 0; w < 256; w++) {
        unsigned v = 0;
        for (int d = 0; d < BN_TRIT5_QUADS; d++) v = 3 * v + window_digit(w, d);
        if (byte_of[v] < 0) byte_of[v] = (int)w;
    }
    for (unsigned q = 0; q < 256; q++) {
        unsigned v = 0;
        for (int d = 0; d < BN_TRIT5_QUADS; d++) v = 3 * v + (unsigned)bn_trit5_file_digit(q, d);
        to_window[q] = (uint8_t)byte_of[v];
    }
}

int bn_trit5_window_digit(unsigned q, int d) { return (int)window_digit(q & 255, d); }

void bn_trit5_translate(uint8_t *bytes, size_t n) {
    pthread_once(&to_window_once, build_to_window);
    for (size_t i = 0; i < n; i++) bytes[i] = to_window[bytes[i]];
}
