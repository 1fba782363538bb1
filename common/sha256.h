/*
 * gs_sha256.h: SHA-256 (FIPS 180-4), for the content address of datasets.
 *
 * gpushare's store names every dataset by the sha256 of its bytes; gpuctl
 * computes it while reading a file so the daemon can check the upload at
 * commit and so a job can refer to data as "sha256:HEX". Small and
 * dependency-free on purpose: the client library links nothing but
 * protobuf-c.
 */
#ifndef GS_SHA256_H
#define GS_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct gs_sha256 {
  uint32_t h[8];     /* chaining state */
  uint64_t bytes;    /* message length so far */
  uint8_t block[64]; /* pending partial block */
  size_t fill;       /* bytes in block */
} gs_sha256;

void gs_sha256_init(gs_sha256 *s);
void gs_sha256_update(gs_sha256 *s, const void *data, size_t len);
void gs_sha256_final(gs_sha256 *s, uint8_t digest[32]);
/* 64 lowercase hex digits and a NUL into hex[65]. */
void gs_sha256_hex(const uint8_t digest[32], char hex[65]);

#endif
