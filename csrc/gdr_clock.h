/* Monotonic time for the measurement loops. */
#ifndef GDR_CLOCK_H
#define GDR_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Nanoseconds of CLOCK_MONOTONIC, never stepped by NTP, so intervals stay honest without
 * calibrating a cycle counter. Where the clocksource has a vDSO path (TSC) this is no system
 * call; where it has none (HPET, some guests) each read is one, about a microsecond. */
static inline uint64_t gdr_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#endif
