/* The inner loop of db/signature_index.py: a text's similarity to every output of one segment of the inverted
 * index. For each of the text's stems found in the segment (n of them: where its postings start, how many, and
 * the stem's unit weight in the text), add the weight times each posting's weight to the posting's output. */
#include <stddef.h>
#include <stdint.h>

void signature_scores(const int64_t *starts, const int64_t *lengths, const float *query, size_t n,
                      const int32_t *rows, const float *weights, float *scores)
{
    for (size_t i = 0; i < n; i++) {
        const int32_t *row = rows + starts[i];
        const float *weight = weights + starts[i];
        const float q = query[i];
        const int64_t length = lengths[i];
        for (int64_t j = 0; j < length; j++)
            scores[row[j]] += q * weight[j];
    }
}
