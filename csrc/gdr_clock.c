#include "gdr_clock.h"

#define MARK_TRIES 5
#define READ_COST_TRIES 32

void gdr_clock_mark(const struct gdr_clock *clock, struct gdr_clock_mark *mark)
{
    uint64_t best = UINT64_MAX;
    int i;

    for (i = 0; i < MARK_TRIES; i++) {
        uint64_t before = gdr_monotonic_ns();
        uint64_t ticks = gdr_clock_ticks(clock);
        uint64_t after = gdr_monotonic_ns();

        if (after - before < best) {
            best = after - before;
            mark->ns = before + (after - before) / 2;
            mark->ticks = ticks;
        }
    }
}

double gdr_counter_calibrate(uint64_t window_ns)
{
    struct gdr_clock counter = {GDR_CLOCK_COUNTER, 1.0};
    struct gdr_clock_mark start, end;

    if (!GDR_HAVE_COUNTER)
        return 0.0;
    gdr_clock_mark(&counter, &start);
    do
        gdr_clock_mark(&counter, &end);
    while (end.ns - start.ns < window_ns);
    if (end.ticks <= start.ticks)
        return 0.0;
    return (double)(end.ns - start.ns) / (double)(end.ticks - start.ticks);
}

double gdr_clock_agreement(const struct gdr_clock *clock, const struct gdr_clock_mark *start,
                           const struct gdr_clock_mark *end)
{
    if (end->ns <= start->ns)
        return 1.0;
    /* Signed: a counter that went backwards gives a negative agreement, never a huge one. */
    return (double)(int64_t)(end->ticks - start->ticks) * clock->ns_per_tick /
           (double)(end->ns - start->ns);
}

uint64_t gdr_clock_read_ticks(const struct gdr_clock *clock)
{
    uint64_t best = UINT64_MAX, before = gdr_clock_ticks(clock);
    int i;

    for (i = 0; i < READ_COST_TRIES; i++) {
        uint64_t after = gdr_clock_ticks(clock);

        if (after - before < best)
            best = after - before;
        before = after;
    }
    return best;
}

uint64_t gdr_clock_span_ns(const struct gdr_clock *clock, uint64_t ticks, uint64_t read_ticks)
{
    return (uint64_t)(gdr_clock_ns(clock, ticks > read_ticks ? ticks - read_ticks : 0) + 0.5);
}
