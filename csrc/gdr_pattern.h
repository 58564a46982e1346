/* The payload pattern: writer and receiver derive the same bytes from a seed. */
#ifndef GDR_PATTERN_H
#define GDR_PATTERN_H

#include <stddef.h>
#include <stdint.h>

/* Byte the receiver fills its buffer with before a round, so that bytes nobody wrote
 * and writes past the message are both caught. */
#define GDR_POISON_BYTE 0xA5

/* Seed for one measured round: differs with the message size and the round number, so
 * bytes left over from an earlier size or round never verify. */
uint64_t gdr_pattern_seed(uint64_t size, uint64_t round);

/* Byte at offset i of the pattern of seed: any offset can be checked on its own. */
uint8_t gdr_pattern_byte(uint64_t seed, uint64_t offset);

void gdr_pattern_fill(uint8_t *buf, size_t len, uint64_t seed);

/* Number of bytes of buf[0, len) that differ from the pattern; the first such offset
 * goes to *first_bad (left untouched when all bytes match). */
size_t gdr_pattern_verify(const uint8_t *buf, size_t len, uint64_t seed, size_t *first_bad);

/* A bandwidth round's messages each land in a slot of their own, slot k at k * size,
 * with a pattern of its own (gdr_slot_seed): a message written to the wrong slot, or a
 * wrong one that a later right one would have overwritten, is caught. */
uint64_t gdr_slot_seed(uint64_t seed, uint64_t slot);

void gdr_slots_fill(uint8_t *buf, size_t size, size_t slots, uint64_t seed);

/* Wrong bytes over the slots; the slots holding any in *bad_slots, the first wrong
 * offset from buf in *first_bad (untouched when all match). */
size_t gdr_slots_verify(const uint8_t *buf, size_t size, size_t slots, uint64_t seed,
                        size_t *bad_slots, size_t *first_bad);

/* Number of bytes of buf[0, len) that are not the poison byte; first one in *first_bad. */
size_t gdr_poison_verify(const uint8_t *buf, size_t len, size_t *first_bad);

#endif
