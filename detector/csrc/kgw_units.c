/* One pass over a text's scored positions for the keyed kgw schemes: each position's seed, green flag, key-free
 * unit identity (watermark/units.py), previous occurrence of its dedup unit, and whether the common-unit table
 * (detector/common_units.py) leaves it out.
 *   anchor_units: minhash and selfhash, the seed the keyed min over the context (and for selfhash the token
 *                 itself), the unit (seed, token);
 *   seeded_units: unigram and lefthash, the seeds given (one per position), the unit the (h + 1)-gram;
 *   common_frequencies: the common-unit table's frequency of each identity given (every spec's lookups).
 * detector/scoring_kernel.py calls them through ctypes; the Python path in watermark/scheme.py and
 * detector/scoring.py defines every number and is what tests/test_scoring_kernel.py compares them with.
 *
 * Common arguments: ids [n]; position i = 0 .. n - h - 1 scores token ids[i + h] after ids[i .. i + h - 1].
 * slots: the common-unit table's open-addressing slots, slot_mask + 1 of them, each (identity, 0 empty; the
 * frequency's float32 bits), searched for at most `probes` probes; a position whose frequency is >=
 * common_threshold points at itself in prev. slots NULL: no table. dedup 0: prev -1 everywhere but left-out
 * positions. anchor_units and seeded_units return 0; -1 when a token id is outside [0, vocab_size) (the caller falls back to the Python
 * path, which reports it); -2 when the dedup map cannot be allocated.
 * match: NULL, or the own-output match to run over the same ids in this call (match_request below). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GOLDEN 0x9E3779B97F4A7C15ULL
#define TOKEN_TAG 1ULL
#define PAIR_TAG 2ULL
#define GRAM_TAG 3ULL
#define MAX_GRAM 5 /* watermark/units.py: longer n-grams are not named */
#define AHEAD 16

/* The detector's own-output match (db/output_grams.py GramIndex.match_ids), run by the scoring call so that a
 * verdict crosses into C once: fn is db/csrc/count_table.c's output_grams_match, passed by address with its
 * arguments (db/output_grams.py MatchRequest lays this struct out); status 1 when it ran, -1 when it could not
 * allocate (the caller then matches on its own), 0 when this call never got to it. */
typedef int (*match_fn)(const int64_t *ids, size_t n, int gram, uint64_t key, uint64_t sample_mask,
                        const int64_t *table, uint64_t table_mask, int table_shift, int64_t *out);
typedef struct {
    match_fn fn;
    int64_t gram;
    uint64_t key, sample_mask;
    const int64_t *table;
    uint64_t table_mask;
    int64_t table_shift;
    int64_t out[3];
    int64_t status;
} match_request;

static void run_match(match_request *match, const int64_t *ids, int64_t n) {
    if (match != NULL)
        match->status = match->fn(ids, (size_t)n, (int)match->gram, match->key, match->sample_mask, match->table,
                                  match->table_mask, (int)match->table_shift, match->out) == 0 ? 1 : -1;
}

static inline uint64_t splitmix(uint64_t x) {
    uint64_t z = x + GOLDEN;
    z ^= z >> 30;
    z *= 0xBF58476D1CE4E5B9ULL;
    z ^= z >> 27;
    z *= 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return z;
}

static inline uint64_t named(uint64_t identity) { return identity ? identity : 1ULL; }

static inline uint64_t packed_identity(uint64_t tag, uint64_t high, uint64_t low) {
    return named(splitmix((tag << 62) | (high << 31) | low));
}

static inline int green(uint64_t seed, int64_t mixed_token, uint64_t multiplier, int64_t green_below) {
    uint64_t mixed = (seed ^ (uint64_t)mixed_token) * ((seed * multiplier) | 1ULL);
    return (int64_t)mixed < green_below;
}

static int ids_in_range(const int64_t *ids, int64_t n, int64_t vocab_size) {
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab_size)
            return 0;
    return 1;
}

static uint64_t map_size(int64_t count) {
    uint64_t size = 16;
    while (size < 2 * (uint64_t)count)
        size <<= 1;
    return size;
}

/* The float32 bits of identity's frequency in the common-unit table, 0 (the bits of 0.0) when it is not there. */
static inline uint32_t frequency_bits(uint64_t id, const uint64_t *slots, uint64_t slot_mask, int probes) {
    for (int p = 0; p < probes; p++) {
        uint64_t at = (id + (uint64_t)p) & slot_mask;
        uint64_t found = slots[2 * at];
        if (found == id) /* an unnamed unit (0) meets an empty slot, whose frequency is 0 */
            return (uint32_t)slots[2 * at + 1];
        if (found == 0)
            break;
    }
    return 0;
}

/* Positions the common-unit table leaves out point at themselves. */
static void exclude_common(const uint64_t *identities, int64_t count, const uint64_t *slots, uint64_t slot_mask,
                           int probes, float common_threshold, int64_t *prev) {
    for (int64_t i = 0; i < count; i++) {
        if (i + AHEAD < count)
            __builtin_prefetch(slots + 2 * (identities[i + AHEAD] & slot_mask));
        uint32_t bits = frequency_bits(identities[i], slots, slot_mask, probes);
        float frequency;
        memcpy(&frequency, &bits, sizeof frequency);
        if (frequency >= common_threshold)
            prev[i] = i;
    }
}

/* frequencies [count]: each identity's frequency in the table as float32 bits (CommonUnits.frequency_of). */
void common_frequencies(const uint64_t *identities, int64_t count, const uint64_t *slots, uint64_t slot_mask,
                        int probes, uint32_t *frequencies) {
    for (int64_t i = 0; i < count; i++) {
        if (i + AHEAD < count)
            __builtin_prefetch(slots + 2 * (identities[i + AHEAD] & slot_mask));
        frequencies[i] = frequency_bits(identities[i], slots, slot_mask, probes);
    }
}

/* units [n - h, 2]: (seed, token) per position. */
int anchor_units(const int64_t *ids, int64_t n, int h, int selfhash, int64_t vocab_size,
                 const int64_t *token_values, const int64_t *salt, const int64_t *own,
                 const int64_t *vocab_mix, uint64_t multiplier, int64_t green_below,
                 const uint64_t *slots, uint64_t slot_mask, int probes, float common_threshold,
                 int dedup, uint8_t *flags, int64_t *units, uint64_t *identities, int64_t *prev,
                 match_request *match) {
    run_match(match, ids, n);
    int64_t count = n - h;
    if (count <= 0)
        return 0;
    if (!ids_in_range(ids, n, vocab_size))
        return -1;

    for (int64_t i = 0; i < count; i++) {
        const int64_t *gram = ids + i;
        int64_t token = gram[h];
        int64_t best;
        int anchor;
        if (selfhash) {
            int64_t s = salt[token];
            best = own[token];
            anchor = h;
            for (int j = 0; j < h; j++) {
                int64_t v = token_values[gram[j]] ^ s;
                /* the first minimum of [context values..., own], as torch's min over those columns picks */
                if (v < best || (v == best && anchor == h)) {
                    best = v;
                    anchor = j;
                }
            }
        } else {
            best = token_values[gram[0]];
            anchor = 0;
            for (int j = 1; j < h; j++) {
                int64_t v = token_values[gram[j]];
                if (v < best) {
                    best = v;
                    anchor = j;
                }
            }
        }
        flags[i] = (uint8_t)green((uint64_t)best, vocab_mix[token], multiplier, green_below);
        units[2 * i] = best;
        units[2 * i + 1] = token;
        identities[i] = anchor < h ? packed_identity(PAIR_TAG, (uint64_t)gram[anchor], (uint64_t)token)
                                   : packed_identity(TOKEN_TAG, 0, (uint64_t)token);
    }

    for (int64_t i = 0; i < count; i++)
        prev[i] = -1;
    if (dedup) {
        uint64_t size = map_size(count), mask = size - 1;
        int64_t *map = malloc(size * 3 * sizeof(int64_t)); /* (seed, token, last position) per slot; -1 empty */
        if (map == NULL)
            return -2;
        for (uint64_t k = 0; k < size; k++)
            map[3 * k + 2] = -1;
        for (int64_t i = 0; i < count; i++) {
            int64_t seed = units[2 * i], token = units[2 * i + 1];
            uint64_t at = splitmix((uint64_t)seed ^ ((uint64_t)token << 40)) & mask;
            for (;;) {
                int64_t *slot = map + 3 * at;
                if (slot[2] < 0) {
                    slot[0] = seed;
                    slot[1] = token;
                    slot[2] = i;
                    break;
                }
                if (slot[0] == seed && slot[1] == token) {
                    prev[i] = slot[2];
                    slot[2] = i;
                    break;
                }
                at = (at + 1) & mask;
            }
        }
        free(map);
    }
    if (slots != NULL)
        exclude_common(identities, count, slots, slot_mask, probes, common_threshold, prev);
    return 0;
}

/* seeds [n - h]: each position's seed (NULL: every position has `seed`). identity: 1 the token (unigram), 2 the
 * (h + 1)-gram (lefthash; unnamed, 0, beyond MAX_GRAM tokens). The dedup unit is the (h + 1)-gram. */
int seeded_units(const int64_t *ids, int64_t n, int h, const int64_t *seeds, int64_t seed, int identity,
                 int64_t vocab_size, const int64_t *vocab_mix, uint64_t multiplier, int64_t green_below,
                 const uint64_t *slots, uint64_t slot_mask, int probes, float common_threshold,
                 int dedup, uint8_t *flags, uint64_t *identities, int64_t *prev, match_request *match) {
    run_match(match, ids, n);
    int64_t count = n - h;
    if (count <= 0)
        return 0;
    if (!ids_in_range(ids, n, vocab_size))
        return -1;
    int width = h + 1;
    uint64_t start = splitmix(splitmix(GRAM_TAG) ^ (uint64_t)width);
    for (int64_t i = 0; i < count; i++) {
        const int64_t *gram = ids + i;
        int64_t token = gram[h];
        flags[i] = (uint8_t)green((uint64_t)(seeds ? seeds[i] : seed), vocab_mix[token], multiplier, green_below);
        if (identity == 1) {
            identities[i] = packed_identity(TOKEN_TAG, 0, (uint64_t)token);
        } else if (width > MAX_GRAM) {
            identities[i] = 0;
        } else {
            uint64_t acc = start;
            for (int j = 0; j < width; j++)
                acc = splitmix(acc ^ (uint64_t)gram[j]);
            identities[i] = named(acc);
        }
    }

    for (int64_t i = 0; i < count; i++)
        prev[i] = -1;
    if (dedup) {
        uint64_t size = map_size(count), mask = size - 1;
        int64_t *map = malloc(size * sizeof(int64_t)); /* last position of a gram per slot; -1 empty */
        if (map == NULL)
            return -2;
        for (uint64_t k = 0; k < size; k++)
            map[k] = -1;
        for (int64_t i = 0; i < count; i++) {
            const int64_t *gram = ids + i;
            uint64_t hash = 0;
            for (int j = 0; j < width; j++)
                hash = splitmix(hash ^ (uint64_t)gram[j]);
            uint64_t at = hash & mask;
            for (;;) {
                int64_t last = map[at];
                if (last < 0) {
                    map[at] = i;
                    break;
                }
                if (memcmp(ids + last, gram, (size_t)width * sizeof(int64_t)) == 0) {
                    prev[i] = last;
                    map[at] = i;
                    break;
                }
                at = (at + 1) & mask;
            }
        }
        free(map);
    }
    if (slots != NULL)
        exclude_common(identities, count, slots, slot_mask, probes, common_threshold, prev);
    return 0;
}
