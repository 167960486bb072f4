/* The detector's per-key unit counts as an open-addressing hash table (loaded by db/count_table.py).
 *
 * slots: 2^k (unit, count) pairs side by side (one cache line per probe), linear probing from the top k bits of
 * the unit identity (identities are 64-bit hashes, so their top bits are uniform); unit 0 marks an empty slot.
 * A lookup is one or two cache lines, where a binary search over the same units sorted touches ~17. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#define SMALL 4096 /* log(count + 1/2) is read from a table below this */
#define AHEAD 16   /* lookups prefetched ahead */
static double small_logs[SMALL];
static int small_logs_ready = 0;

static inline size_t slot_of(const int64_t *slots, uint64_t mask, int shift, int64_t unit) {
    size_t slot = (size_t)((uint64_t)unit >> shift);
    while (slots[2 * slot] != 0 && slots[2 * slot] != unit)
        slot = (slot + 1) & mask;
    return slot;
}

static inline int64_t count_of(const int64_t *slots, uint64_t mask, int shift, int64_t unit) {
    if (unit == 0)
        return 0;
    size_t slot = slot_of(slots, mask, shift, unit);
    return slots[2 * slot] == unit ? slots[2 * slot + 1] : 0;
}

/* count[unit] += increments[i] for each unit (0 skipped); returns how many units were new to the table.
 * The caller keeps the table at most half full, so every probe ends. */
size_t count_table_add(int64_t *slots, uint64_t mask, int shift, const int64_t *units, const int64_t *increments,
                       size_t n) {
    size_t added = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t unit = units[i];
        if (unit == 0)
            continue;
        size_t slot = slot_of(slots, mask, shift, unit);
        if (slots[2 * slot] == 0) {
            slots[2 * slot] = unit;
            added++;
        }
        slots[2 * slot + 1] += increments[i];
    }
    return added;
}

/* out[i] = the count of units[i] (0 when absent). */
void count_table_counts(const int64_t *slots, uint64_t mask, int shift, const int64_t *units, size_t n,
                        double *out) {
    for (size_t i = 0; i < n; i++)
        out[i] = (double)count_of(slots, mask, shift, units[i]);
}

/* The spoof check's sums over the positions i with prev[i] < 0 (first occurrences): x = log(count + 1/2) of
 * units[i], y = scores[i]; the moments about the means from sums shifted by the first x and y (one pass, no
 * division per element; the shift keeps the cancellation to the spread of the values).
 * out: counted positions, Sxx, Syy, sum y (x - mean x), sum x^2, sum y^2 (detector/spoof_check.py turns them
 * into the permutation z). */
void count_table_spoof_sums(const int64_t *slots, uint64_t mask, int shift, const int64_t *units,
                            const double *scores, const int64_t *prev, size_t n, double *out) {
    if (!small_logs_ready) { /* idempotent: two threads racing here write the same values */
        for (int c = 0; c < SMALL; c++)
            small_logs[c] = log((double)c + 0.5);
        small_logs_ready = 1;
    }
    size_t m = 0;
    double kx = 0.0, ky = 0.0, sx = 0.0, sy = 0.0, sxx = 0.0, syy = 0.0, sxy = 0.0, rx = 0.0, ry = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (i + AHEAD < n && prev[i + AHEAD] < 0) /* overlap the cache misses of the next lookups */
            __builtin_prefetch(&slots[2 * ((uint64_t)units[i + AHEAD] >> shift)]);
        if (prev[i] >= 0)
            continue;
        int64_t count = count_of(slots, mask, shift, units[i]);
        double x = count < SMALL ? small_logs[count] : log((double)count + 0.5), y = scores[i];
        if (m == 0) {
            kx = x;
            ky = y;
        }
        m++;
        double dx = x - kx, dy = y - ky;
        sx += dx;
        sy += dy;
        sxx += dx * dx;
        syy += dy * dy;
        sxy += dx * dy;
        rx += x * x;
        ry += y * y;
    }
    double count = (double)m;
    out[0] = count;
    out[1] = m ? sxx - sx * sx / count : 0.0;
    out[2] = m ? syy - sy * sy / count : 0.0;
    out[3] = m ? sxy - sx * sy / count : 0.0;
    out[4] = rx;
    out[5] = ry;
}

/* The sampled keyed n-gram hashes of a token sequence, in position order (db/output_grams.py text_grams: the same
 * arithmetic as its numpy form): each window's tokens absorbed into the key, then splitmix64's finaliser; kept
 * when (hash & sample_mask) == 0 and hash != 0. Writes at most n - gram + 1 hashes to out; returns how many. */
size_t output_grams_hash(const int64_t *ids, size_t n, int gram, uint64_t key, uint64_t sample_mask, int64_t *out) {
    size_t kept = 0;
    if (gram <= 0 || n < (size_t)gram)
        return 0;
    for (size_t i = 0; i + (size_t)gram <= n; i++) {
        uint64_t h = key;
        for (int j = 0; j < gram; j++) {
            h ^= (uint64_t)ids[i + (size_t)j];
            h *= 0x9E3779B97F4A7C15ULL;
            h ^= h >> 29;
        }
        h ^= h >> 30;
        h *= 0xBF58476D1CE4E5B9ULL;
        h ^= h >> 27;
        h *= 0x94D049BB133111EBULL;
        h ^= h >> 31;
        if ((h & sample_mask) == 0 && h != 0)
            out[kept++] = (int64_t)h;
    }
    return kept;
}
