/* Everything of the engine's C side that depends on the operating system or reads the CPU's identity: the CPU
 * features the kernel paths need (Linux's AMX permission on x86; aarch64's dot product and i8mm from Linux's
 * auxiliary vector or macOS's sysctl) and the huge-page advice. One path per system: Linux, macOS, and other POSIX
 * systems (where a reading that has no portable call says "no"). No other file of _kernels/ includes an OS header
 * beyond POSIX threads and time. The Python side's readings (cores, memory, resident bytes) are
 * bitnet_app/platform.py's. */
#ifndef BITNET_PLATFORM_H
#define BITNET_PLATFORM_H

#include <stddef.h>

/* aarch64: 1 when the CPU has the dot product (FEAT_DotProd: sdot) / the int8 matrix multiply (FEAT_I8MM: smmla)
 * and the OS lets programs use them; 0 elsewhere (another CPU, or an OS this file cannot ask). */
int bn_cpu_has_dotprod(void);
int bn_cpu_has_i8mm(void);
/* x86: 1 when the OS saves the AMX tile state and gives this process the right to use the tile data (Linux asks for
 * it once, for all threads); 0 without AMX, on other systems, or when refused. Call only with the CPU's AMX-INT8
 * bits already checked (dispatch.c). */
int bn_os_permits_amx(void);
/* Advises the OS to back [p, p + n) with huge pages (Linux transparent huge pages); nothing where there are none. */
void bn_advise_huge_pages(void *p, size_t n);

#endif
