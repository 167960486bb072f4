/* The word stems of a UTF-8 text, as db/passage_words.py's ``stems`` cuts them, looked up among the fitted stems.
 *
 * A word is a run of bytes that are ASCII letters, digits or '_', or bytes of non-ASCII characters; any other
 * ASCII byte separates words. A word of ASCII bytes only has its stem (its first STEM_CHARS bytes, lower-cased)
 * packed into an integer (byte i at bits 8i, so at most 48 bits) and looked up in an open-addressing table of the
 * fitted ASCII stems: one 64-bit slot each, the packed stem in the low 48 bits and its row + 1 in the high 16
 * (0: empty), so a probe reads one word of memory. The word's row, or -1 when it is not fitted. A word holding a
 * non-ASCII byte is -2: the caller reads it with the pattern. Per word: the row, and where the word starts and
 * ends in ``text``.
 *
 * ``text_stem_counts`` keeps, of the fitted rows, only those ``kept`` marks, each once, with how often the text
 * has it (at most 255): a verdict needs the set of a text's stems, not their sequence. */
#include <stddef.h>
#include <stdint.h>

#define STEM_CHARS 6
#define STEM_BITS 48

static inline int word_byte(uint8_t c)
{
    return c >= 0x80 || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

size_t text_stems(const uint8_t *text, size_t n, const uint64_t *slots, uint64_t mask, int shift, int32_t *out_rows,
                  int64_t *out_starts, int64_t *out_ends, size_t capacity)
{
    const uint64_t stem_mask = ((uint64_t)1 << STEM_BITS) - 1;
    size_t words = 0, i = 0;
    while (i < n && words < capacity) {
        while (i < n && !word_byte(text[i]))
            i++;
        if (i >= n)
            break;
        size_t start = i;
        int ascii = 1;
        uint64_t packed = 0;
        while (i < n && word_byte(text[i])) {
            uint8_t c = text[i];
            if (c >= 0x80)
                ascii = 0;
            else if (i - start < STEM_CHARS)
                packed |= (uint64_t)(c >= 'A' && c <= 'Z' ? c + 32 : c) << (8 * (i - start));
            i++;
        }
        int32_t row = -2;
        if (ascii) {
            row = -1;
            uint64_t slot = (packed * 0x9E3779B97F4A7C15ULL) >> shift;
            while (slots[slot]) {
                if ((slots[slot] & stem_mask) == packed) {
                    row = (int32_t)(slots[slot] >> STEM_BITS) - 1;
                    break;
                }
                slot = (slot + 1) & mask;
            }
        }
        out_rows[words] = row;
        out_starts[words] = (int64_t)start;
        out_ends[words] = (int64_t)i;
        words++;
    }
    return words;
}

/* Per entry: a fitted row that ``kept`` marks (its first occurrence; ``out_counts`` its occurrences), or a word
 * the caller reads (-1, -2, as ``text_stems``) with where it starts and ends. ``seen`` is zero, one byte per
 * fitted row, and is left zero. */
size_t text_stem_counts(const uint8_t *text, size_t n, const uint64_t *slots, uint64_t mask, int shift,
                        const uint8_t *kept, uint8_t *seen, int32_t *out_rows, int64_t *out_starts, int64_t *out_ends,
                        int64_t *out_counts, size_t capacity)
{
    size_t words = text_stems(text, n, slots, mask, shift, out_rows, out_starts, out_ends, capacity), entries = 0;
    for (size_t w = 0; w < words; w++) {
        int32_t row = out_rows[w];
        if (row >= 0) {
            if (!kept[row])
                continue;
            if (seen[row]) {
                if (seen[row] < 255)
                    seen[row]++;
                continue;
            }
            seen[row] = 1;
        }
        out_rows[entries] = row;
        out_starts[entries] = out_starts[w];
        out_ends[entries] = out_ends[w];
        entries++;
    }
    for (size_t e = 0; e < entries; e++) {
        int32_t row = out_rows[e];
        out_counts[e] = row >= 0 ? seen[row] : 0;
        if (row >= 0)
            seen[row] = 0;
    }
    return entries;
}
