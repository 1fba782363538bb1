/* call.c: the per-request arena of call.h: chunks of 16 KiB (or one
 * larger allocation) chained and freed together. */
#include <stdlib.h>
#include <string.h>

#include "control/call.h"

struct ar_chunk {
  struct ar_chunk *next;
  size_t used, cap;
  _Alignas(16) unsigned char data[];
};


void *ar_alloc(arena *a, size_t n) {
  n = (n + 15) & ~(size_t)15;
  if (!a->head || a->head->cap - a->head->used < n) {
    size_t cap = n > 16384 ? n : 16384;
    ar_chunk *c = malloc(sizeof *c + cap);
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

char *ar_strdup(arena *a, const char *s) {
  size_t n = strlen(s) + 1;
  char *p = ar_alloc(a, n);
  if (p) memcpy(p, s, n);
  return p;
}

void ar_free(arena *a) {
  for (ar_chunk *c = a->head, *n; c; c = n) {
    n = c->next;
    free(c);
  }
  a->head = NULL;
}

void *ar_memdup(arena *a, const void *p, size_t n) {
  void *q = ar_alloc(a, n ? n : 1);
  if (q && n) memcpy(q, p, n);
  return q;
}

void *ar_init(arena *a, size_t n, const void *init) {
  void *p = ar_alloc(a, n);
  if (p) memcpy(p, init, n);
  return p;
}
