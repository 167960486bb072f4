/* The detector's per-key unit counts as an open-addressing hash table (loaded by db/count_table.py).
 *
 * slots: 2^k (unit, count) pairs side by side (one cache line per probe), linear probing from the top k bits of
 * the unit identity (identities are 64-bit hashes, so their top bits are uniform); unit 0 marks an empty slot.
 * A lookup is one or two cache lines, where a binary search over the same units sorted touches ~17. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

/* Adds each unit (0 skipped) with its value (values[i], or ``value`` for all when values is NULL); returns how
 * many units were new to the table. A count table (owners 0) sums the values: count[unit] += values[i]. An owner
 * table (owners 1, db/output_grams.py GramIndex) holds an n-gram's output row + 1 while one output holds it and
 * -1 once two do (one output's units are distinct, under one value), except that a unit ``keep`` (> 0) holds
 * stays its: the output added is a copy of that one. A new unit takes its value either way. The caller keeps the
 * table at most half full, so every probe ends. */
static size_t merge(int64_t *slots, uint64_t mask, int shift, const int64_t *units, const int64_t *values,
                    int64_t value, size_t n, int owners, int64_t keep) {
    size_t added = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t unit = units[i];
        if (values != NULL)
            value = values[i];
        if (unit == 0)
            continue;
        size_t slot = slot_of(slots, mask, shift, unit);
        if (slots[2 * slot] == 0) {
            slots[2 * slot] = unit;
            slots[2 * slot + 1] = value;
            added++;
        } else if (!owners) {
            slots[2 * slot + 1] += value;
        } else if (slots[2 * slot + 1] != value && (keep <= 0 || slots[2 * slot + 1] != keep)) {
            slots[2 * slot + 1] = -1;
        }
    }
    return added;
}

/* merge of each unit with its value: a count table's add (owners 0), or an owner table's (owners 1). */
size_t table_add(int64_t *slots, uint64_t mask, int shift, const int64_t *units, const int64_t *values, size_t n,
                 int owners) {
    return merge(slots, mask, shift, units, values, 0, n, owners, 0);
}

/* One more unit for ``owner`` (> 0) in a hash of 2^bits (owner, count) pairs, 0 empty, kept at most half full;
 * *best is the owner counted most so far (the smaller on a tie), *most its count. */
static inline void tally(int64_t *pairs, int bits, int64_t owner, int64_t *best, int64_t *most) {
    size_t at = (size_t)(((uint64_t)owner * 0x9E3779B97F4A7C15ULL) >> (64 - bits));
    while (pairs[2 * at] != 0 && pairs[2 * at] != owner)
        at = (at + 1) & (((size_t)1 << bits) - 1);
    pairs[2 * at] = owner;
    int64_t count = ++pairs[2 * at + 1];
    if (count > *most || (count == *most && owner < *best)) {
        *best = owner;
        *most = count;
    }
}

/* Outputs added to an owner table in order: output k is units[offsets[k] .. offsets[k + 1]) (distinct) under
 * values[k] (its row + 1). When one earlier output alone holds at least half of output k's units (the smaller
 * row + 1 on a tie), output k is a copy of it and leaves that output's units to it (merge's keep). Returns how
 * many units were new, or (size_t)-1 when scratch memory could not be allocated (nothing added). */
size_t owner_table_add_outputs(int64_t *slots, uint64_t mask, int shift, const int64_t *units,
                               const int64_t *offsets, const int64_t *values, size_t outputs) {
    size_t largest = 16;
    for (size_t k = 0; k < outputs; k++)
        while (largest < 2 * (size_t)(offsets[k + 1] - offsets[k]))
            largest <<= 1;
    int64_t *held = malloc(2 * largest * sizeof(int64_t)); /* (owner value, count) pairs, 0 empty */
    if (held == NULL)
        return (size_t)-1;
    size_t added = 0;
    for (size_t k = 0; k < outputs; k++) {
        const int64_t *own = units + offsets[k];
        size_t n = (size_t)(offsets[k + 1] - offsets[k]), size = 16;
        int bits = 4;
        while (size < 2 * n) {
            size <<= 1;
            bits++;
        }
        memset(held, 0, 2 * size * sizeof(int64_t));
        int64_t best = 0, most = 0;
        for (size_t i = 0; i < n; i++) {
            int64_t owner = count_of(slots, mask, shift, own[i]);
            if (owner > 0)
                tally(held, bits, owner, &best, &most);
        }
        int64_t keep = 2 * (size_t)most >= n && most > 0 ? best : 0;
        added += merge(slots, mask, shift, own, NULL, values[k], n, 1, keep);
    }
    free(held);
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

/* One window's keyed n-gram hash: each token absorbed into the key, then splitmix64's finaliser. */
static inline uint64_t gram_hash(const int64_t *ids, int gram, uint64_t key) {
    uint64_t h = key;
    for (int j = 0; j < gram; j++) {
        h ^= (uint64_t)ids[j];
        h *= 0x9E3779B97F4A7C15ULL;
        h ^= h >> 29;
    }
    h ^= h >> 30;
    h *= 0xBF58476D1CE4E5B9ULL;
    h ^= h >> 27;
    h *= 0x94D049BB133111EBULL;
    h ^= h >> 31;
    return h;
}

/* gram_hash of every 5-token window (db/output_grams.py GRAM), with the length a constant so that the compiler
 * unrolls it and vectorises across windows: AVX-512 has a 64-bit multiply, and the clone the CPU can run is
 * chosen at load time (GCC on x86-64; elsewhere the plain loop, the same numbers). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HASH5_CLONES __attribute__((target_clones("arch=skylake-avx512", "default"), optimize("O3")))
#else
#define HASH5_CLONES
#endif
HASH5_CLONES
static void hash5(const int64_t *ids, size_t windows, uint64_t key, int64_t *out) {
    for (size_t i = 0; i < windows; i++)
        out[i] = (int64_t)gram_hash(ids + i, 5, key); /* inlined with the constant: unrolled, then vectorised */
}

/* The sampled keyed n-gram hashes of a token sequence, in position order (db/output_grams.py text_grams: the same
 * arithmetic as its numpy form): each window's tokens absorbed into the key, then splitmix64's finaliser; kept
 * when (hash & sample_mask) == 0 and hash != 0. Writes at most n - gram + 1 hashes to out; returns how many. */
size_t output_grams_hash(const int64_t *ids, size_t n, int gram, uint64_t key, uint64_t sample_mask, int64_t *out) {
    if (gram <= 0 || n < (size_t)gram)
        return 0;
    size_t windows = n - (size_t)gram + 1, kept = 0;
    if (gram == 5)
        hash5(ids, windows, key, out);
    else
        for (size_t i = 0; i < windows; i++) /* independent windows, no branch: the multiplies overlap */
            out[i] = (int64_t)gram_hash(ids + i, gram, key);
    for (size_t i = 0; i < windows; i++) { /* compacted in place without a branch (the sample bit is a coin) */
        uint64_t h = (uint64_t)out[i];
        out[kept] = (int64_t)h;
        kept += (size_t)(((h & sample_mask) == 0) & (h != 0));
    }
    return kept;
}

/* db/output_grams.py GramIndex.match_ids in one call: the text's distinct sampled n-grams (output_grams_hash's),
 * each looked up in the index's owner table (owner_table_add_outputs); the row that owns most of them alone wins
 * (the smaller row on a tie, as numpy's unique and argmax).
 * No sort: the text's n-grams are deduplicated in a hash set of its own, and the owned rows counted in another.
 * out: distinct sampled n-grams, best row (-1 when none is owned), n-grams it owns. Returns 0, or -1 when the
 * scratch memory could not be allocated (the caller then takes the numpy path). */
int output_grams_match(const int64_t *ids, size_t n, int gram, uint64_t key, uint64_t sample_mask,
                       const int64_t *owners_table, uint64_t table_mask, int table_shift, int64_t *out) {
    out[0] = 0;
    out[1] = -1;
    out[2] = 0;
    if (gram <= 0 || n < (size_t)gram)
        return 0;
    size_t windows = n - (size_t)gram + 1, size = 16;
    /* grams: the sampled hashes, then the distinct ones, in text order; after them seen (n-gram hashes, 0 empty)
     * and owners ((row + 1, count) pairs, 0 empty: rows are >= 0, GramIndex.add), sized by the sampled count
     * (at most half full) and only they zeroed */
    size_t largest = 16; /* the set's size for a text whose every n-gram is sampled */
    while (largest < 2 * windows)
        largest <<= 1;
    int64_t *grams = malloc((windows + 3 * largest) * sizeof(int64_t));
    if (grams == NULL)
        return -1;
    size_t sampled = output_grams_hash(ids, n, gram, key, sample_mask, grams), distinct = 0;
    int bits = 4;
    while (size < 2 * sampled) {
        size <<= 1;
        bits++;
    }
    int64_t *seen = grams + windows, *owners = seen + size;
    memset(seen, 0, 3 * size * sizeof(int64_t));
    uint64_t mask = size - 1;
    int shift = 64 - bits;
    for (size_t i = 0; i < sampled; i++) {
        int64_t h = grams[i];
        size_t slot = (size_t)((uint64_t)h >> shift);
        while (seen[slot] != 0 && seen[slot] != h)
            slot = (slot + 1) & mask;
        if (seen[slot] == 0) { /* nearly always: a text seldom repeats a 5-gram */
            seen[slot] = h;
            grams[distinct++] = h;
        }
    }
    int64_t best = 0, most = 0; /* the owner (row + 1) of most n-grams so far, the smaller on a tie */
    for (size_t i = 0; i < distinct; i++) {
        if (i + AHEAD < distinct) /* the table is far larger than a cache: overlap the misses */
            __builtin_prefetch(&owners_table[2 * ((uint64_t)grams[i + AHEAD] >> table_shift)]);
        int64_t owner = count_of(owners_table, table_mask, table_shift, grams[i]); /* row + 1 of its one owner */
        if (owner > 0)
            tally(owners, bits, owner, &best, &most);
    }
    free(grams);
    out[0] = (int64_t)distinct;
    out[1] = most > 0 ? best - 1 : -1;
    out[2] = most;
    return 0;
}
