/* Scratch memory of the kernels, one growable buffer per thread and per use (kernels.h bn_thread_buffer): the
 * forwards run without an allocation once warm, and each thread that runs one (the calling thread, the pool's
 * workers) has its own. The uses are kept apart because they nest: tiles5.c holds its unpacked 2-bit tiles while the
 * AMX kernel that multiplies them uses its own scratch. Freed when the thread ends. */
#include <pthread.h>
#include <stdlib.h>

#include "kernels.h"

typedef struct {
    uint8_t *p;
    size_t capacity;
} buffer;

static pthread_key_t buffers_key;
static pthread_once_t buffers_once = PTHREAD_ONCE_INIT;
static void free_buffers(void *b) {
    buffer *buffers = b;
    for (int use = 0; use < BN_SCRATCH_USES; use++) free(buffers[use].p);
    free(buffers);
}
static void make_key(void) { pthread_key_create(&buffers_key, free_buffers); }

void *bn_thread_buffer(int use, size_t bytes) {
    pthread_once(&buffers_once, make_key);
    buffer *buffers = pthread_getspecific(buffers_key);
    if (!buffers) {
        buffers = calloc(BN_SCRATCH_USES, sizeof *buffers);
        if (!buffers) return NULL;
        if (pthread_setspecific(buffers_key, buffers)) { free(buffers); return NULL; }
    }
    buffer *b = &buffers[use];
    if (!b->p || bytes > b->capacity) {
        const size_t rounded = bytes ? (bytes + 63) / 64 * 64 : 64;
        uint8_t *p = aligned_alloc(64, rounded);
        if (!p) return NULL;
        free(b->p);
        b->p = p;
        b->capacity = rounded;
    }
    return b->p;
}
