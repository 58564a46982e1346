#include "gdr_wait.h"

#include <string.h>

#include "gdr_loop.h"

void gdr_watchdog_init(struct gdr_watchdog *w, uint64_t stall_ticks)
{
    memset(w, 0, sizeof(*w));
    w->stall_ticks = stall_ticks;
}

int gdr_watchdog_spin(struct gdr_watchdog *w, const struct gdr_clock *clock, volatile int *stop)
{
    uint64_t now;

    if (++w->spins % GDR_SPINS_BETWEEN_STOP_CHECKS)
        return GDR_OK;
    if (*stop)
        return GDR_ERR_STOPPED;
    if (w->spins % GDR_SPINS_BETWEEN_CLOCK_CHECKS)
        return GDR_OK;
    now = gdr_clock_ticks(clock);
    if (!w->last_progress || w->progressed) {
        w->last_progress = now;
        w->progressed = 0;
        return GDR_OK;
    }
    return now - w->last_progress > w->stall_ticks ? GDR_ERR_STALL : GDR_OK;
}

void gdr_check_clock(const struct gdr_clock *clock, const struct gdr_clock_mark *start,
                     struct gdr_clock_check *check)
{
    struct gdr_clock_mark end;

    gdr_clock_mark(clock, &end);
    check->agreement = gdr_clock_agreement(clock, start, &end);
    check->span_ns = end.ns - start->ns;
}

int gdr_clock_valid(const struct gdr_clock *clock)
{
    return (clock->source == GDR_CLOCK_MONOTONIC ||
            (clock->source == GDR_CLOCK_COUNTER && GDR_HAVE_COUNTER)) &&
           clock->ns_per_tick > 0;
}
