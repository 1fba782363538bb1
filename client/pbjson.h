/*
 * pbjson.h: JSON from protobuf-c messages, and the few members gpuctl
 * writes by hand (see pbjson.c for the mapping).
 */
#ifndef GPUCTL_PBJSON_H
#define GPUCTL_PBJSON_H

#include <stdint.h>
#include <stdio.h>

#include <protobuf-c/protobuf-c.h>

/* A streaming JSON writer: commas and nesting tracked on a small stack.
 * Start one as `pbjson j = {.f = stdout};`. */
typedef struct pbjson {
  FILE *f;
  int depth;
  int count[64]; /* members written at each depth */
} pbjson;

/* key is the member's name inside an object, NULL inside an array or at the
 * top. open and close take the bracket: '{' and '}', or '[' and ']'. */
void pbjson_open(pbjson *j, const char *key, char brace);
void pbjson_close(pbjson *j, char brace);
void pbjson_str(pbjson *j, const char *key, const char *v);
void pbjson_u64(pbjson *j, const char *key, uint64_t v);
void pbjson_bool(pbjson *j, const char *key, int v);
/* m field by field from its descriptor; null when m is NULL. */
void pbjson_message(pbjson *j, const char *key, const ProtobufCMessage *m);

/* Print one message as a JSON line on stdout. */
void pbjson_print(const ProtobufCMessage *m);

#endif
