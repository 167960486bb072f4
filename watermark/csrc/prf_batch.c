/* Batched HMAC-SHA256 seeds for watermark.prf.KeyedPRF.seed_words (loaded by watermark/prf_kernel.py).
 *
 * HMAC (RFC 2104) as Python's hmac computes it, for n messages of `width` bytes each, every one preceded by
 * the same prefix: H(key ^ opad || H(key ^ ipad || prefix || message)), of which the first 8 bytes are kept.
 * The two hash states after the key blocks (and the prefix) are computed once and copied per message, so a
 * message costs two SHA-256 finalisations in OpenSSL's libcrypto (SHA extensions where the CPU has them). */
#include <stddef.h>
#include <string.h>
#include <openssl/sha.h>

int prf_hmac_sha256_words(const unsigned char *inner_block, const unsigned char *outer_block,
                          const unsigned char *prefix, size_t prefix_len, const unsigned char *messages,
                          size_t width, size_t count, unsigned char *out) {
    SHA256_CTX inner, outer, ctx;
    unsigned char digest[SHA256_DIGEST_LENGTH];
    if (!SHA256_Init(&inner) || !SHA256_Update(&inner, inner_block, SHA256_CBLOCK)
        || !SHA256_Update(&inner, prefix, prefix_len))
        return 1;
    if (!SHA256_Init(&outer) || !SHA256_Update(&outer, outer_block, SHA256_CBLOCK))
        return 1;
    for (size_t i = 0; i < count; i++) {
        ctx = inner;
        if (!SHA256_Update(&ctx, messages + i * width, width) || !SHA256_Final(digest, &ctx))
            return 1;
        ctx = outer;
        if (!SHA256_Update(&ctx, digest, SHA256_DIGEST_LENGTH) || !SHA256_Final(digest, &ctx))
            return 1;
        memcpy(out + 8 * i, digest, 8);
    }
    return 0;
}
