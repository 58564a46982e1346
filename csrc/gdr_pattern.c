#include "gdr_pattern.h"

#include <string.h>

/* splitmix64: a cheap, well-mixed 64-bit hash; neighbouring words differ in every bit. */
static inline uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t gdr_pattern_seed(uint64_t size, uint64_t round)
{
    return mix64(mix64(size) ^ round);
}

uint8_t gdr_pattern_byte(uint64_t seed, uint64_t offset)
{
    return (uint8_t)(mix64(seed ^ (offset >> 3)) >> ((offset & 7) * 8));
}

void gdr_pattern_fill(uint8_t *buf, size_t len, uint64_t seed)
{
    size_t word, words = len / 8, i;

    for (word = 0; word < words; word++) {
        uint64_t value = mix64(seed ^ word);
        memcpy(buf + word * 8, &value, 8);   /* little-endian: byte k is bits 8k..8k+7 */
    }
    for (i = words * 8; i < len; i++)
        buf[i] = gdr_pattern_byte(seed, i);
}

size_t gdr_pattern_verify(const uint8_t *buf, size_t len, uint64_t seed, size_t *first_bad)
{
    size_t bad = 0, word, words = len / 8, i;

    /* Compare a word at a time; look at single bytes only inside a word that differs. */
    for (word = 0; word < words; word++) {
        uint64_t value = mix64(seed ^ word);
        if (memcmp(buf + word * 8, &value, 8) == 0)
            continue;
        for (i = word * 8; i < word * 8 + 8; i++) {
            if (buf[i] != gdr_pattern_byte(seed, i) && bad++ == 0)
                *first_bad = i;
        }
    }
    for (i = words * 8; i < len; i++) {
        if (buf[i] != gdr_pattern_byte(seed, i) && bad++ == 0)
            *first_bad = i;
    }
    return bad;
}

uint64_t gdr_slot_seed(uint64_t seed, uint64_t slot)
{
    return seed + slot * 0x9e3779b97f4a7c15ull;   /* golden ratio: spreads the seeds apart */
}

void gdr_slots_fill(uint8_t *buf, size_t size, size_t slots, uint64_t seed)
{
    size_t slot;

    for (slot = 0; slot < slots; slot++)
        gdr_pattern_fill(buf + slot * size, size, gdr_slot_seed(seed, slot));
}

size_t gdr_messages_verify(const uint8_t *buf, size_t size, size_t slots, size_t src_slots,
                           uint64_t seed, uint64_t first, size_t count, size_t *bad_messages,
                           size_t *first_bad)
{
    size_t i, bad = 0, offset, where = 0, wrong;
    uint64_t k;

    *bad_messages = 0;
    for (i = 0; i < count; i++) {
        k = first + i;
        offset = (size_t)(k % slots) * size;
        wrong = gdr_pattern_verify(buf + offset, size, gdr_slot_seed(seed, k % src_slots),
                                   &where);
        if (wrong == 0)
            continue;
        if (bad == 0)
            *first_bad = offset + where;
        bad += wrong;
        (*bad_messages)++;
    }
    return bad;
}

size_t gdr_poison_verify(const uint8_t *buf, size_t len, size_t *first_bad)
{
    const uint64_t poison = 0x0101010101010101ull * GDR_POISON_BYTE;
    size_t bad = 0, word, words = len / 8, i;
    uint64_t value;

    /* As gdr_pattern_verify: a word at a time, single bytes only where a word differs. */
    for (word = 0; word < words; word++) {
        memcpy(&value, buf + word * 8, 8);
        if (value == poison)
            continue;
        for (i = word * 8; i < word * 8 + 8; i++) {
            if (buf[i] != GDR_POISON_BYTE && bad++ == 0)
                *first_bad = i;
        }
    }
    for (i = words * 8; i < len; i++) {
        if (buf[i] != GDR_POISON_BYTE && bad++ == 0)
            *first_bad = i;
    }
    return bad;
}
