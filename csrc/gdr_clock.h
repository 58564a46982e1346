/* The measurement loops' time source: the CPU's cycle counter where it can be trusted,
 * else CLOCK_MONOTONIC.
 *
 * Where the kernel's clocksource has no vDSO path (HPET, acpi_pm: some guests) every
 * clock_gettime is a system call of about a microsecond, as long as part of a small
 * message's round trip. The cycle counter (x86 TSC, arm64 CNTVCT_EL0) is one unprivileged
 * instruction. The loops count in ticks of the chosen source; ns_per_tick, calibrated by
 * the caller against CLOCK_MONOTONIC, converts. Each run takes a (monotonic, ticks) mark at
 * its start and end, so the caller can cross-check the counter's rate over the run. */
#ifndef GDR_CLOCK_H
#define GDR_CLOCK_H

#include <stdint.h>
#include <time.h>

enum gdr_clock_source {
    GDR_CLOCK_MONOTONIC = 0,
    GDR_CLOCK_COUNTER = 1,
};

struct gdr_clock {
    int source;              /* enum gdr_clock_source */
    double ns_per_tick;      /* 1.0 for CLOCK_MONOTONIC */
};

/* A reading of both clocks at one moment, to calibrate or cross-check the counter. */
struct gdr_clock_mark {
    uint64_t ns;             /* CLOCK_MONOTONIC */
    uint64_t ticks;          /* the run's source */
};

#if defined(__x86_64__) || defined(__aarch64__)
#define GDR_HAVE_COUNTER 1
#else
#define GDR_HAVE_COUNTER 0
#endif

static inline uint64_t gdr_monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t gdr_counter_ticks(void)
{
#if defined(__x86_64__)
    uint32_t lo, hi;
    __asm__ __volatile__("rdtsc" : "=a"(lo), "=d"(hi));
    return ((uint64_t)hi << 32) | lo;
#elif defined(__aarch64__)
    uint64_t ticks;
    /* The isb keeps the read from being taken ahead of the code before it. */
    __asm__ __volatile__("isb; mrs %0, cntvct_el0" : "=r"(ticks) : : "memory");
    return ticks;
#else
    return gdr_monotonic_ns();
#endif
}

static inline uint64_t gdr_clock_ticks(const struct gdr_clock *clock)
{
    return clock->source == GDR_CLOCK_COUNTER ? gdr_counter_ticks() : gdr_monotonic_ns();
}

static inline uint64_t gdr_clock_ticks_in(const struct gdr_clock *clock, uint64_t ns)
{
    return (uint64_t)((double)ns / clock->ns_per_tick);
}

static inline double gdr_clock_ns(const struct gdr_clock *clock, uint64_t ticks)
{
    return (double)ticks * clock->ns_per_tick;
}

/* Read both clocks at (nearly) one moment: the tick read bracketed by two monotonic reads,
 * the tightest bracket of a few tries, so a preemption does not skew the pair. */
void gdr_clock_mark(const struct gdr_clock *clock, struct gdr_clock_mark *mark);

/* The cost of one read of the run's clock, in its ticks: the least of a few back-to-back
 * reads' differences. Every interval the loops time runs from one read's latch to another's,
 * so it holds the end of the first read and the start of the second: one whole read. With
 * the cycle counter that is a few nanoseconds; with CLOCK_MONOTONIC on a clocksource without
 * a vDSO path (HPET in the lab's guests) it is a system call of about a microsecond, which
 * the latency loops take back out of each sample (perftest reads the cycle counter). */
uint64_t gdr_clock_read_ticks(const struct gdr_clock *clock);

/* An interval of `ticks` from one read's latch to a later, distinct read's, in ns less the
 * one whole read it holds (read_ticks, gdr_clock_read_ticks), rounded: the path's time, not
 * the clock's. Never below 0: an interval under the least read measured (the counter's
 * jitter, a read that came out quicker) is 0. An interval that is not one (both ends the
 * same read, or no start) holds no read, and is not passed here. */
uint64_t gdr_clock_span_ns(const struct gdr_clock *clock, uint64_t ticks, uint64_t read_ticks);

/* The counter's ns per tick over a busy window of window_ns; 0 where there is no counter. */
double gdr_counter_calibrate(uint64_t window_ns);

/* Nanoseconds between two marks by the run's clock, over the same span by CLOCK_MONOTONIC:
 * 1.0 when the counter kept time; 1.0 always for CLOCK_MONOTONIC. */
double gdr_clock_agreement(const struct gdr_clock *clock, const struct gdr_clock_mark *start,
                           const struct gdr_clock_mark *end);

#endif
