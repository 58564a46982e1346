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

/* A bandwidth round's message k lands in slot k mod slots of the receiver's buffer, at
 * that times size, and is sent from source slot k mod src_slots, whose pattern is its own
 * (gdr_slot_seed). With one more source slot than slots, a slot's next message carries
 * other bytes than its last: a write that never landed, or landed in the wrong slot, is
 * caught, as is a wrong one that a later right one would have overwritten. */
uint64_t gdr_slot_seed(uint64_t seed, uint64_t slot);

/* The source slots: slot k holds size bytes of its own pattern. */
void gdr_slots_fill(uint8_t *buf, size_t size, size_t slots, uint64_t seed);

/* Check the round's messages first to first + count - 1 (count <= slots) where they
 * landed. Wrong bytes; the messages holding any in *bad_messages, the first wrong offset
 * from buf in *first_bad (untouched when all match). */
size_t gdr_messages_verify(const uint8_t *buf, size_t size, size_t slots, size_t src_slots,
                           uint64_t seed, uint64_t first, size_t count, size_t *bad_messages,
                           size_t *first_bad);

/* Number of bytes of buf[0, len) that are not the poison byte; first one in *first_bad. */
size_t gdr_poison_verify(const uint8_t *buf, size_t len, size_t *first_bad);

#endif
