/* The inner loop of db/signature_index.py: a text's similarity to every output of one segment of the inverted
 * index. Each of the text's stems (sorted hashes, unit weights) is found among the segment's sorted hashes by
 * binary search; when the postings of those found number at most ``budget``, each posting's weight times the
 * stem's weight in the text is added to its output's score. Returns how many postings the text's stems have
 * there (more than ``budget``: nothing was added, and the caller chooses which stems to read). */
#include <stddef.h>
#include <stdint.h>

static size_t find(const uint32_t *hashes, size_t n, uint32_t hash)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (hashes[mid] < hash)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < n && hashes[lo] == hash ? lo : n;
}

int64_t signature_scores(const uint32_t *query, const float *query_weights, size_t nq, const uint32_t *hashes,
                         size_t n_hashes, const int64_t *starts, const int32_t *rows, const float *weights,
                         int64_t budget, int64_t *found, float *scores)
{
    int64_t total = 0;
    for (size_t i = 0; i < nq; i++) {
        size_t at = find(hashes, n_hashes, query[i]);
        found[i] = at < n_hashes ? (int64_t)at : -1;
        if (at < n_hashes)
            total += starts[at + 1] - starts[at];
    }
    if (total > budget)
        return total;
    for (size_t i = 0; i < nq; i++) {
        if (found[i] < 0)
            continue;
        const int64_t a = starts[found[i]], b = starts[found[i] + 1];
        const float q = query_weights[i];
        for (int64_t j = a; j < b; j++)
            scores[rows[j]] += q * weights[j];
    }
    return total;
}
