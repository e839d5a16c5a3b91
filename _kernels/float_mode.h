/* The engine computes with denormal floats flushed to zero (FTZ: results below 2^-126 become 0; DAZ: such inputs
 * count as 0), the mode GPUs and most inference engines run in. Why: softmax gives tiny probabilities wherever the
 * attention is peaked (real models' attention sinks, random weights), p * v is then a denormal, and on x86 every
 * denormal result costs a microcode assist of ~100 cycles, which makes a peaked attention several times slower
 * than its arithmetic. What it changes: terms below 1.2e-38, which cannot move an fp32 sum of larger terms anyway.
 * bn_forward sets the mode on the calling thread for the call and restores the caller's; the pool's workers keep it.
 * Elsewhere than x86 nothing changes (those CPUs handle denormals at full speed or flush by default). */
#ifndef BITNET_FLOAT_MODE_H
#define BITNET_FLOAT_MODE_H

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define BN_MXCSR_FTZ_DAZ 0x8040u /* bit 15 flush to zero, bit 6 denormals are zero */
/* Sets FTZ and DAZ on this thread; returns the previous mode for bn_restore_float_mode. */
static inline unsigned bn_flush_denormals(void) {
    const unsigned old = _mm_getcsr();
    _mm_setcsr(old | BN_MXCSR_FTZ_DAZ);
    return old;
}
static inline void bn_restore_float_mode(unsigned old) { _mm_setcsr(old); }
#else
static inline unsigned bn_flush_denormals(void) { return 0; }
static inline void bn_restore_float_mode(unsigned old) { (void)old; }
#endif

#endif
