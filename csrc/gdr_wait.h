/* What every busy loop shares: the stall deadline of a wait, the check of the run's clock
 * against CLOCK_MONOTONIC, and whether a clock can be used. */
#ifndef GDR_WAIT_H
#define GDR_WAIT_H

#include <stdint.h>

#include "gdr_clock.h"

struct gdr_clock_check;

/* Busy waits look at the stop flag (a memory read) every GDR_SPINS_BETWEEN_STOP_CHECKS
 * empty polls or spins, and at the clock, for the stall deadline, only every
 * GDR_SPINS_BETWEEN_CLOCK_CHECKS: the deadline is seconds, and with CLOCK_MONOTONIC on a
 * clocksource without a vDSO path each read is a system call. */
#define GDR_SPINS_BETWEEN_STOP_CHECKS 1024
#define GDR_SPINS_BETWEEN_CLOCK_CHECKS 65536

/* The stall deadline of a busy wait: progress only sets a flag; the clock is read every
 * GDR_SPINS_BETWEEN_CLOCK_CHECKS idle spins, which then either restarts the deadline (there
 * was progress since the last look) or compares against it. */
struct gdr_watchdog {
    uint64_t stall_ticks;
    uint64_t spins;
    uint64_t last_progress;    /* 0: not looked at the clock yet */
    int progressed;
};

void gdr_watchdog_init(struct gdr_watchdog *w, uint64_t stall_ticks);

/* One idle spin: GDR_OK to go on, or the status that ends the wait (stopped, stalled). */
int gdr_watchdog_spin(struct gdr_watchdog *w, const struct gdr_clock *clock, volatile int *stop);

/* How far the clock agreed with CLOCK_MONOTONIC from start to now. */
void gdr_check_clock(const struct gdr_clock *clock, const struct gdr_clock_mark *start,
                     struct gdr_clock_check *check);

/* A clock this build can read, with a positive tick length. */
int gdr_clock_valid(const struct gdr_clock *clock);

#endif
