#include "gdr_stats.h"

#include <math.h>
#include <stdlib.h>

static int compare_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

uint64_t gdr_percentile_sorted(const uint64_t *sorted, size_t n, double q)
{
    /* Nearest rank: the smallest sample with at least q of the samples at or below it. */
    size_t rank = (size_t)ceil(q * (double)n);
    if (rank < 1)
        rank = 1;
    if (rank > n)
        rank = n;
    return sorted[rank - 1];
}

int gdr_latency_summarize(uint64_t *samples, size_t n, struct gdr_latency_summary *out)
{
    double sum = 0.0, squares = 0.0, mean;
    size_t i;

    if (n == 0)
        return -1;
    qsort(samples, n, sizeof(*samples), compare_u64);
    for (i = 0; i < n; i++)
        sum += (double)samples[i];
    mean = sum / (double)n;
    for (i = 0; i < n; i++)
        squares += ((double)samples[i] - mean) * ((double)samples[i] - mean);

    out->samples = n;
    out->min_ns = (double)samples[0];
    out->max_ns = (double)samples[n - 1];
    out->mean_ns = mean;
    out->stdev_ns = n > 1 ? sqrt(squares / (double)(n - 1)) : 0.0;
    out->median_ns = n % 2 ? (double)samples[n / 2]
                           : ((double)samples[n / 2 - 1] + (double)samples[n / 2]) / 2.0;
    out->p99_ns = (double)gdr_percentile_sorted(samples, n, 0.99);
    out->p999_ns = (double)gdr_percentile_sorted(samples, n, 0.999);
    return 0;
}
