/* call.c: the per-request arena of call.h: chunks of 16 KiB (or one
 * larger allocation) chained and freed together. */
#include <stdlib.h>
#include <string.h>

#include "control/call.h"

struct gs_call_chunk {
  struct gs_call_chunk *next;
  size_t used, cap;
  _Alignas(16) unsigned char data[];
};


void *gs_call_alloc(gs_call_arena *a, size_t n) {
  n = (n + 15) & ~(size_t)15;
  if (!a->head || a->head->cap - a->head->used < n) {
    size_t cap = n > 16384 ? n : 16384;
    gs_call_chunk *c = malloc(sizeof *c + cap);
    if (!c) {
      a->failed = true;
      return NULL;
    }
    c->next = a->head;
    c->used = 0;
    c->cap = cap;
    a->head = c;
  }
  void *p = a->head->data + a->head->used;
  a->head->used += n;
  memset(p, 0, n);
  return p;
}

char *gs_call_strdup(gs_call_arena *a, const char *s) {
  size_t n = strlen(s) + 1;
  char *p = gs_call_alloc(a, n);
  if (p) memcpy(p, s, n);
  return p;
}

void gs_call_arena_free(gs_call_arena *a) {
  for (gs_call_chunk *c = a->head, *n; c; c = n) {
    n = c->next;
    free(c);
  }
  a->head = NULL;
}

void *gs_call_memdup(gs_call_arena *a, const void *p, size_t n) {
  void *q = gs_call_alloc(a, n ? n : 1);
  if (q && n) memcpy(q, p, n);
  return q;
}

void *gs_call_msg_init(gs_call_arena *a, size_t n, const void *init) {
  void *p = gs_call_alloc(a, n);
  if (p) memcpy(p, init, n);
  return p;
}
