/* Monotonic time for the measurement loops. */
#ifndef GDR_CLOCK_H
#define GDR_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Nanoseconds of CLOCK_MONOTONIC: served from the vDSO (no system call) and never
 * stepped by NTP, so intervals stay honest without calibrating a cycle counter. */
static inline uint64_t gdr_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#endif
