/* Tokens in blocks for the 256-bit kernels (kernels_avx2.c, kernels_avxvnni.c): T tokens are taken in blocks of
 * up to TOKENS_PER_BLOCK, and CALL(BT) runs one block with its size BT a compile-time constant, so that the kernels'
 * per-token loops unroll and their accumulators stay in registers. Expects T (tokens) in scope and gives CALL t0
 * (the block's first token). */
#ifndef BITNET_TOKEN_BLOCKS_H
#define BITNET_TOKEN_BLOCKS_H

#define TOKENS_PER_BLOCK 8

#define DISPATCH_BLOCKS(CALL)                                                        \
    for (int t0 = 0; t0 < T;) {                                                      \
        const int bt = T - t0 >= TOKENS_PER_BLOCK ? TOKENS_PER_BLOCK : T - t0;       \
        switch (bt) {                                                                \
            case 8: CALL(8); break;                                                  \
            case 7: CALL(7); break;                                                  \
            case 6: CALL(6); break;                                                  \
            case 5: CALL(5); break;                                                  \
            case 4: CALL(4); break;                                                  \
            case 3: CALL(3); break;                                                  \
            case 2: CALL(2); break;                                                  \
            default: CALL(1); break;                                                 \
        }                                                                            \
        t0 += bt;                                                                    \
    }

#endif
