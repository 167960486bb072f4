/* One pass over a text's scored positions for the anchored kgw schemes (minhash, selfhash): each position's
 * seed (the keyed min over its context, and for selfhash the token itself), green flag, key-free unit identity
 * (watermark/units.py), previous occurrence of its (seed, token) unit, and whether the common-unit table
 * (detector/common_units.py) leaves it out. detector/scoring_kernel.py calls it through ctypes; the Python
 * path in watermark/scheme.py and detector/scoring.py defines every number and is what the tests compare
 * this with. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define GOLDEN 0x9E3779B97F4A7C15ULL
#define PAIR_TAG 2ULL
#define TOKEN_TAG 1ULL
#define AHEAD 16

static inline uint64_t splitmix(uint64_t x) {
    uint64_t z = x + GOLDEN;
    z ^= z >> 30;
    z *= 0xBF58476D1CE4E5B9ULL;
    z ^= z >> 27;
    z *= 0x94D049BB133111EBULL;
    z ^= z >> 31;
    return z;
}

static inline uint64_t packed_identity(uint64_t tag, uint64_t high, uint64_t low) {
    uint64_t out = splitmix((tag << 62) | (high << 31) | low);
    return out ? out : 1ULL;
}

/* Returns 0; -1 when a token id is outside [0, vocab_size) (the caller falls back to the Python path, which
 * reports it); -2 when the dedup map cannot be allocated.
 * ids [n]; positions i = 0 .. n - h - 1 score token ids[i + h] after context ids[i .. i + h - 1].
 * selfhash: also the token's own salted value competes (anchor index h, a token identity).
 * slots: the common-unit table's open-addressing slots, slot_mask + 1 of them, each (identity, 0 empty; the
 * frequency's float32 bits), searched for at most `probes` probes; a position whose frequency is >= common_threshold points at
 * itself in prev. slots NULL: no table. dedup 0: prev -1 everywhere but left-out positions. */
int anchor_units(const int64_t *ids, int64_t n, int h, int selfhash, int64_t vocab_size,
                 const int64_t *token_values, const int64_t *salt, const int64_t *own,
                 const int64_t *vocab_mix, uint64_t multiplier, int64_t green_below,
                 const uint64_t *slots, uint64_t slot_mask, int probes, float common_threshold,
                 int dedup, uint8_t *flags, int64_t *units, uint64_t *identities, int64_t *prev) {
    int64_t count = n - h;
    if (count <= 0)
        return 0;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab_size)
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
        uint64_t s = (uint64_t)best;
        uint64_t mixed = (s ^ (uint64_t)vocab_mix[token]) * ((s * multiplier) | 1ULL);
        flags[i] = (int64_t)mixed < green_below;
        units[2 * i] = best;
        units[2 * i + 1] = token;
        identities[i] = anchor < h ? packed_identity(PAIR_TAG, (uint64_t)gram[anchor], (uint64_t)token)
                                   : packed_identity(TOKEN_TAG, 0, (uint64_t)token);
    }

    if (dedup) {
        uint64_t size = 16;
        while (size < 2 * (uint64_t)count)
            size <<= 1;
        /* (seed, token, last position) per slot; position -1 empty */
        int64_t *map = malloc(size * 3 * sizeof(int64_t));
        if (map == NULL)
            return -2;
        for (uint64_t k = 0; k < size; k++)
            map[3 * k + 2] = -1;
        uint64_t mask = size - 1;
        for (int64_t i = 0; i < count; i++) {
            int64_t token = ids[i + h];
            int64_t seed = units[2 * i];
            uint64_t at = splitmix((uint64_t)seed ^ ((uint64_t)token << 40)) & mask;
            for (;;) {
                int64_t *slot = map + 3 * at;
                if (slot[2] < 0) {
                    slot[0] = seed;
                    slot[1] = token;
                    slot[2] = i;
                    prev[i] = -1;
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
    } else {
        for (int64_t i = 0; i < count; i++)
            prev[i] = -1;
    }

    if (slots != NULL) {
        for (int64_t i = 0; i < count; i++) {
            if (i + AHEAD < count)
                __builtin_prefetch(slots + 2 * (identities[i + AHEAD] & slot_mask));
            uint64_t id = identities[i];
            for (int p = 0; p < probes; p++) {
                uint64_t at = (id + (uint64_t)p) & slot_mask;
                uint64_t found = slots[2 * at];
                if (found == id) {
                    uint32_t bits = (uint32_t)slots[2 * at + 1];
                    float frequency;
                    memcpy(&frequency, &bits, sizeof frequency);
                    if (frequency >= common_threshold)
                        prev[i] = i;
                    break;
                }
                if (found == 0)
                    break;
            }
        }
    }
    return 0;
}
