/* Summary statistics of latency samples. */
#ifndef GDR_STATS_H
#define GDR_STATS_H

#include <stddef.h>
#include <stdint.h>

struct gdr_latency_summary {
    size_t samples;
    double min_ns;
    double median_ns;
    double mean_ns;
    double stdev_ns;
    double p99_ns;
    double p999_ns;
    double max_ns;
};

/* Sorts samples in place and fills the summary; returns -1 when n is 0. */
int gdr_latency_summarize(uint64_t *samples, size_t n, struct gdr_latency_summary *out);

/* Nearest-rank percentile (q in [0, 1]) of an ascending array of n > 0 samples. */
uint64_t gdr_percentile_sorted(const uint64_t *sorted, size_t n, double q);

#endif
