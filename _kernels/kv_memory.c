/* The KV cache's memory: zeroed, backed by transparent huge pages where the OS gives them (as the weights are,
 * bitnet_app/engine/resident.py). A decode token's attention streams every cached K/V row of the context; from
 * 4 KB pages that stream misses the TLB every 4 KB. 2B-4T decode at 4,000 positions, fp16 cache, 2 threads on a
 * Zen 4: attention XX -> XX ms.
 * What it costs: the kernel backs the cache 2 MB at a time, so its memory is taken as soon as each head's first
 * rows are written (one head of a layer is ctx * hd elements: 1 MB for 2B-4T at 4,096 positions), not as the
 * context grows. */
#include <stdlib.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "engine_state.h"

void *bn_kv_alloc(size_t bytes) {
    if (bytes == 0) bytes = 1;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0); /* zeroed */
    if (p == MAP_FAILED) return NULL;
    madvise(p, bytes, MADV_HUGEPAGE); /* advice: memory without huge pages works the same, only slower */
    return p;
#else
    return calloc(bytes, 1);
#endif
}

void bn_kv_free(void *p, size_t bytes) {
    if (!p) return;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    munmap(p, bytes == 0 ? 1 : bytes);
#else
    (void)bytes;
    free(p);
#endif
}
