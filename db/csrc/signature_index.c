/* The inner loop of db/signature_index.py: a text's similarity to every output of one segment of the inverted
 * index. Each of the text's stems (its hash, and its weight times its inverse document frequency: ``products``)
 * is found among the segment's sorted hashes through a directory of their top ``bits`` bits (the hashes are
 * keyed, so spread evenly: a bucket holds a few, and a look-up reads two or three cache lines where a binary
 * search over the whole array would miss the caches at each of its last steps). When the postings of those
 * found number at most ``budget``, each posting (an output's position) gets the stem's product added to its
 * output's score, and each score is then multiplied by its output's ``scales`` (one over its vector's norm).
 * Returns how many postings the text's stems have there (more than ``budget``: nothing was added, and the caller
 * chooses which stems to read). */
#include <stddef.h>
#include <stdint.h>

static int64_t find(const uint32_t *hashes, const uint32_t *directory, int bits, uint32_t hash)
{
    uint32_t bucket = bits ? (uint32_t)((uint64_t)hash >> (32 - bits)) : 0;
    for (uint32_t at = directory[bucket]; at < directory[bucket + 1]; at++)
        if (hashes[at] >= hash)
            return hashes[at] == hash ? (int64_t)at : -1;
    return -1;
}

/* one function per width of a posting: a segment of at most 65,536 outputs stores them in 16 bits */
#define SIGNATURE_SCORES(NAME, ROW)                                                                              \
    int64_t NAME(const uint32_t *query, const float *products, size_t nq, const uint32_t *hashes,                 \
                 const uint32_t *directory, int bits, const int64_t *starts, const ROW *rows, const float *scales, \
                 size_t n_rows, int64_t budget, int64_t *found, float *scores)                                   \
    {                                                                                                            \
        int64_t total = 0;                                                                                       \
        for (size_t i = 0; i < nq; i++) {                                                                        \
            if (i + 8 < nq && bits) /* the directory entry 8 stems ahead */                                     \
                __builtin_prefetch(directory + ((uint64_t)query[i + 8] >> (32 - bits)));                         \
            found[i] = find(hashes, directory, bits, query[i]);                                                  \
            if (found[i] >= 0)                                                                                   \
                total += starts[found[i] + 1] - starts[found[i]];                                                \
        }                                                                                                        \
        if (total > budget || total == 0)                                                                        \
            return total;                                                                                        \
        for (size_t i = 0, next = 0; i < nq; i++) {                                                              \
            while (next < nq && (next <= i || found[next] < 0))                                                  \
                next++;                                                                                          \
            if (next < nq) { /* the next stem's postings, fetched while this one's are summed */                 \
                __builtin_prefetch(rows + starts[found[next]]);                                                  \
                __builtin_prefetch(rows + starts[found[next]] + 32);                                             \
            }                                                                                                    \
            if (found[i] < 0)                                                                                    \
                continue;                                                                                        \
            const ROW *row = rows + starts[found[i]], *end = rows + starts[found[i] + 1];                        \
            const float q = products[i];                                                                         \
            for (; row < end; row++)                                                                             \
                scores[*row] += q;                                                                               \
        }                                                                                                        \
        for (size_t r = 0; r < n_rows; r++)                                                                      \
            scores[r] *= scales[r];                                                                              \
        return total;                                                                                            \
    }

SIGNATURE_SCORES(signature_scores, int32_t)
SIGNATURE_SCORES(signature_scores16, uint16_t)
