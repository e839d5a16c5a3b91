/* The AVX-VNNI kernels with vpdpbusd written in AVX2 (exactly: kernels_avxvnni.c, dpbusd_avx2), compiled with AVX2
 * flags only: the kernel path "avxvnni-emulated", which exists so that the tests run the AVX-VNNI kernels' code on
 * every AVX2 machine. Slower than the AVX2 path; never chosen on its own. */
#define BN_VNNI_EMULATED 1
#include "kernels_avxvnni.c"
