/* The AMX kernels with the tile instructions written in plain C (exactly, as the ISA reference defines them) and
 * the AVX2 kernels below 8 tokens, compiled with AVX2 flags only: the kernel path "amx-emulated", which exists so
 * that the tests run the AMX kernels' tiling on every AVX2 machine. Much slower than the AVX2 path; never chosen on
 * its own. */
#define BN_AMX_EMULATED 1
#include "kernels_amx.c"
