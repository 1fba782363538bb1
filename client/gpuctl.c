/*
 * gpuctl.c: the command line of gpushare, for operators and tenants.
 *
 * Every command is one row of the command table below: its words
 * ("vdev create"), its positional arguments, its flags, and the function that
 * turns parsed arguments into gpushare.v1 requests. Arguments are parsed and
 * checked completely before any connection is made, so a typo costs nothing
 * and always exits 2 with the flag and the value named; sizes go through
 * gs_size_parse, integers are strictly decimal and range-checked. Only then
 * is the daemon contacted (exit 1 for anything it refuses or that fails).
 *
 * Output is a human table by default (aligned columns, sizes as "5.00 GiB")
 * and, with --json, the call's result message printed field by field from
 * its protobuf descriptor with the .proto's field names, so the JSON follows
 * the protocol without a hand-written mapping per call: 64-bit integers are
 * plain JSON numbers, enums their names, bytes base64, unset optional fields
 * left out, repeated fields always present ([] when empty).
 *
 * Datasets named by path in a job (idx images/labels) are hashed here,
 * uploaded unless the tenant's store already holds that sha256, and the job
 * is rewritten to refer to "sha256:HEX": the daemon never opens a client's
 * path.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "client/client.h"
#include "common/size.h"
#include "proto/wire.h"

#ifndef GS_VERSION
#define GS_VERSION "unknown"
#endif

#define EXIT_OK 0
#define EXIT_FAIL 1
#define EXIT_USAGE 2

#define MAX_ARGS 128 /* positional arguments or values of one flag */
#define MAX_FLAGS 8

/* ------------------------------------------------------------ commands --- */

typedef struct flagdef {
  const char *name;    /* "--memory" */
  const char *alias;   /* "-o", or NULL */
  const char *metavar; /* "SIZE"; NULL for a switch */
  int repeat;          /* may be given several times */
  int required;
  const char *help;
} flagdef;

typedef struct parsed {
  const char *pos[MAX_ARGS];
  int npos;
  const char *val[MAX_FLAGS][MAX_ARGS]; /* values given for flag i */
  int nval[MAX_FLAGS];
} parsed;

struct command;

typedef struct cli {
  const char *socket; /* --socket, or NULL for the default */
  int json;           /* --json */
  gs_client *c;       /* connected on first use */
  const struct command *cmd;
} cli;

typedef struct command {
  const char *name;    /* "vdev create" */
  const char *args;    /* "NAME" for the usage line */
  int min_pos, max_pos; /* max_pos -1: any number */
  const char *summary;
  const flagdef *flags; /* terminated by a NULL name */
  int (*run)(cli *x, parsed *p);
  const char *details; /* extra help text, or NULL */
} command;

/* ------------------------------------------------------------ messages --- */

static int usage_error(const cli *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int usage_error(const cli *x, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "gpuctl: %s%s", x->cmd ? x->cmd->name : "", x->cmd ? ": " : "");
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\nTry 'gpuctl %s%s--help'.\n", x->cmd ? x->cmd->name : "", x->cmd ? " " : "");
  return EXIT_USAGE;
}

/* A local failure (a file that cannot be read, a spec that does not parse). */
static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int fail(const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "gpuctl: ");
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  return EXIT_FAIL;
}

/* What the daemon refused, or why talking to it failed. */
static int report(int rc, const gs_err *e) {
  if (rc == GS_CLIENT_REFUSED) {
    fprintf(stderr, "gpuctl: %s: %s", gs_code_name(e->code), e->msg);
    if (e->field[0]) fprintf(stderr, " (field: %s)", e->field);
    fputc('\n', stderr);
  } else {
    fprintf(stderr, "gpuctl: %s\n", e->msg[0] ? e->msg : strerror(-rc));
  }
  return EXIT_FAIL;
}

static int connect_daemon(cli *x) {
  if (x->c) return 0;
  gs_err e = {0};
  const char *path = x->socket ? x->socket : gs_client_default_socket();
  int rc = gs_client_connect(path, &x->c, &e);
  if (rc) {
    fprintf(stderr, "gpuctl: %s (is gpushared running? set --socket or GPUSHARE_SOCKET)\n", e.msg);
    return EXIT_FAIL;
  }
  return 0;
}

/* Connect if needed, make the call; on any failure print it and return 1.
 * On a refusal *resp is still set when the daemon sent detail. */
static int call(cli *x, Gpushare__V1__Request *req, Gpushare__V1__Response **resp) {
  *resp = NULL;
  if (connect_daemon(x)) return EXIT_FAIL;
  gs_err e = {0};
  int rc = gs_client_call(x->c, req, resp, &e);
  if (rc) return report(rc, &e);
  return 0;
}

/* ------------------------------------------------------- value parsing --- */

/* Strict decimal: digits only, within [min, max]. */
static int parse_u64(const cli *x, const char *what, const char *s, uint64_t min, uint64_t max,
                     uint64_t *out) {
  uint64_t v = 0;
  const char *p = s;
  if (!*p) return usage_error(x, "%s: the value is empty; expected a whole number from %" PRIu64 " to %" PRIu64, what, min, max);
  for (; *p; p++) {
    if (!isdigit((unsigned char)*p))
      return usage_error(x, "%s: \"%s\" is not a whole number; expected %" PRIu64 " to %" PRIu64, what, s, min, max);
    unsigned d = (unsigned)(*p - '0');
    if (v > (UINT64_MAX - d) / 10) {
      v = UINT64_MAX;
      goto range;
    }
    v = v * 10 + d;
  }
  if (v < min || v > max) {
range:
    return usage_error(x, "%s: %s is out of range; expected %" PRIu64 " to %" PRIu64, what, s, min, max);
  }
  *out = v;
  return 0;
}

static int parse_u32(const cli *x, const char *what, const char *s, uint32_t min, uint32_t max,
                     uint32_t *out) {
  uint64_t v;
  int rc = parse_u64(x, what, s, min, max, &v);
  if (!rc) *out = (uint32_t)v;
  return rc;
}

static int parse_size(const cli *x, const char *what, const char *s, uint64_t *out) {
  gs_err e = {0};
  if (gs_size_parse(s, out, &e)) return usage_error(x, "%s: %s", what, e.msg);
  return 0;
}

static int parse_job_id(const cli *x, const char *s, uint64_t *id) {
  return parse_u64(x, "ID", s, 1, UINT64_MAX, id);
}

/* ---------------------------------------------------------------- JSON --- */

/* A streaming JSON writer: commas and nesting tracked on a small stack. */
typedef struct json {
  FILE *f;
  int depth;
  int count[64]; /* members written at each depth */
} json;

static void json_string(FILE *f, const char *s) {
  fputc('"', f);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    switch (*p) {
      case '"': fputs("\\\"", f); break;
      case '\\': fputs("\\\\", f); break;
      case '\n': fputs("\\n", f); break;
      case '\r': fputs("\\r", f); break;
      case '\t': fputs("\\t", f); break;
      case '\b': fputs("\\b", f); break;
      case '\f': fputs("\\f", f); break;
      default:
        if (*p < 0x20 || *p == 0x7f) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
  }
  fputc('"', f);
}

/* Start a member: comma if needed, then "key": when inside an object. */
static void json_member(json *j, const char *key) {
  if (j->depth > 0 && j->count[j->depth]++ > 0) fputc(',', j->f);
  if (key) {
    json_string(j->f, key);
    fputc(':', j->f);
  }
}

static void json_open(json *j, const char *key, char brace) {
  json_member(j, key);
  fputc(brace, j->f);
  if (j->depth < 63) j->depth++;
  j->count[j->depth] = 0;
}

static void json_close(json *j, char brace) {
  fputc(brace, j->f);
  if (j->depth > 0) j->depth--;
}

static void json_str(json *j, const char *key, const char *v) {
  json_member(j, key);
  json_string(j->f, v ? v : "");
}

static void json_u64(json *j, const char *key, uint64_t v) {
  json_member(j, key);
  fprintf(j->f, "%" PRIu64, v);
}

static void json_i64(json *j, const char *key, int64_t v) {
  json_member(j, key);
  fprintf(j->f, "%" PRId64, v);
}

static void json_num(json *j, const char *key, double v, int digits) {
  json_member(j, key);
  if (isfinite(v)) fprintf(j->f, "%.*g", digits, v);
  else json_string(j->f, isnan(v) ? "NaN" : v > 0 ? "Infinity" : "-Infinity");
}

static void json_bool(json *j, const char *key, int v) {
  json_member(j, key);
  fputs(v ? "true" : "false", j->f);
}

static void json_base64(json *j, const char *key, const uint8_t *p, size_t n) {
  static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  json_member(j, key);
  fputc('"', j->f);
  for (size_t i = 0; i < n; i += 3) {
    uint32_t v = (uint32_t)p[i] << 16;
    if (i + 1 < n) v |= (uint32_t)p[i + 1] << 8;
    if (i + 2 < n) v |= p[i + 2];
    fputc(b64[(v >> 18) & 63], j->f);
    fputc(b64[(v >> 12) & 63], j->f);
    fputc(i + 1 < n ? b64[(v >> 6) & 63] : '=', j->f);
    fputc(i + 2 < n ? b64[v & 63] : '=', j->f);
  }
  fputc('"', j->f);
}

static void json_message(json *j, const char *key, const ProtobufCMessage *m);

/* One value of field f stored at p. */
static void json_value(json *j, const char *key, const ProtobufCFieldDescriptor *f, const void *p) {
  switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32: json_i64(j, key, *(const int32_t *)p); break;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32: json_u64(j, key, *(const uint32_t *)p); break;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64: json_i64(j, key, *(const int64_t *)p); break;
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64: json_u64(j, key, *(const uint64_t *)p); break;
    case PROTOBUF_C_TYPE_FLOAT: json_num(j, key, *(const float *)p, 7); break;
    case PROTOBUF_C_TYPE_DOUBLE: json_num(j, key, *(const double *)p, 17); break;
    case PROTOBUF_C_TYPE_BOOL: json_bool(j, key, *(const protobuf_c_boolean *)p); break;
    case PROTOBUF_C_TYPE_ENUM: {
      int v = *(const int *)p;
      const ProtobufCEnumValue *ev =
          protobuf_c_enum_descriptor_get_value((const ProtobufCEnumDescriptor *)f->descriptor, v);
      if (ev) json_str(j, key, ev->name);
      else json_i64(j, key, v);
      break;
    }
    case PROTOBUF_C_TYPE_STRING: json_str(j, key, *(char *const *)p); break;
    case PROTOBUF_C_TYPE_BYTES: {
      const ProtobufCBinaryData *b = p;
      json_base64(j, key, b->data, b->len);
      break;
    }
    case PROTOBUF_C_TYPE_MESSAGE: json_message(j, key, *(ProtobufCMessage *const *)p); break;
  }
}

static size_t field_size(const ProtobufCFieldDescriptor *f) {
  switch (f->type) {
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64: return 8;
    case PROTOBUF_C_TYPE_DOUBLE: return sizeof(double);
    case PROTOBUF_C_TYPE_BOOL: return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_ENUM: return sizeof(int);
    case PROTOBUF_C_TYPE_STRING: return sizeof(char *);
    case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_MESSAGE: return sizeof(ProtobufCMessage *);
    default: return 4;
  }
}

static void json_message(json *j, const char *key, const ProtobufCMessage *m) {
  if (!m) {
    json_member(j, key);
    fputs("null", j->f);
    return;
  }
  const ProtobufCMessageDescriptor *d = m->descriptor;
  json_open(j, key, '{');
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    const char *base = (const char *)m;
    const void *p = base + f->offset;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      /* always written, [] when empty, so `jq '.job[]'` works on no jobs */
      size_t n = *(const size_t *)(base + f->quantifier_offset);
      const char *arr = *(char *const *)p;
      json_open(j, f->name, '[');
      for (size_t k = 0; k < n; k++) json_value(j, NULL, f, arr + k * field_size(f));
      json_close(j, ']');
      continue;
    }
    int present;
    if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
      present = *(const uint32_t *)(base + f->quantifier_offset) == f->id;
    else if (f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_MESSAGE)
      present = *(void *const *)p != NULL;
    else if (f->quantifier_offset)
      present = *(const protobuf_c_boolean *)(base + f->quantifier_offset);
    else
      present = 1;
    if (present) json_value(j, f->name, f, p);
  }
  json_close(j, '}');
}

/* Print one message as a JSON line on stdout. */
static void print_json(const ProtobufCMessage *m) {
  json j = {.f = stdout};
  json_message(&j, NULL, m);
  fputc('\n', stdout);
  fflush(stdout);
}

/* --------------------------------------------------------------- tables --- */

/* Rows of cells, printed with each column as wide as its widest cell and two
 * spaces between columns; numeric columns are right-aligned (bit i of
 * `right` for column i). Row 0 is the header. */
typedef struct table {
  int ncols;
  unsigned right; /* bit i: right-align column i */
  char **cells;   /* row-major, ncols per row, row 0 the header */
  size_t ncells, cap;
} table;

static void table_cell(table *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void table_cell(table *t, const char *fmt, ...) {
  if (t->ncells == t->cap) {
    size_t cap = t->cap ? 2 * t->cap : 64;
    char **nc = realloc(t->cells, cap * sizeof *nc);
    if (!nc) {
      fprintf(stderr, "gpuctl: out of memory\n");
      exit(EXIT_FAIL);
    }
    t->cells = nc;
    t->cap = cap;
  }
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  if (vasprintf(&s, fmt, ap) < 0) s = NULL;
  va_end(ap);
  if (!s) {
    fprintf(stderr, "gpuctl: out of memory\n");
    exit(EXIT_FAIL);
  }
  t->cells[t->ncells++] = s;
}

static void table_header(table *t, unsigned right, const char *const *names) {
  t->ncols = 0;
  t->right = right;
  for (; names[t->ncols]; t->ncols++) table_cell(t, "%s", names[t->ncols]);
}

static void table_free(table *t) {
  for (size_t i = 0; i < t->ncells; i++) free(t->cells[i]);
  free(t->cells);
  t->cells = NULL;
  t->ncells = t->cap = 0;
}

static void table_fprint(FILE *f, table *t) {
  size_t w[32] = {0};
  for (size_t i = 0; i < t->ncells; i++) {
    size_t n = strlen(t->cells[i]);
    if (n > w[i % (size_t)t->ncols]) w[i % (size_t)t->ncols] = n;
  }
  for (size_t i = 0; i < t->ncells; i++) {
    int col = (int)(i % (size_t)t->ncols);
    int lastcol = col == t->ncols - 1;
    if (t->right & (1u << col)) fprintf(f, "%*s", (int)w[col], t->cells[i]);
    else if (lastcol) fprintf(f, "%s", t->cells[i]);
    else fprintf(f, "%-*s", (int)w[col], t->cells[i]);
    fputs(lastcol ? "\n" : "  ", f);
  }
  table_free(t);
}

static void table_print(table *t) { table_fprint(stdout, t); }

/* Small formatting helpers, each into its own static ring slot so several
 * can appear in one printf. */
static char *slot(void) {
  static char ring[16][64];
  static int next;
  return ring[next++ % 16];
}

static const char *fsize(uint64_t b) { return gs_size_format(b, slot(), 64); }

static const char *fsize_or_unlimited(uint64_t b) { return b ? fsize(b) : "unlimited"; }

static const char *fcount_or_unlimited(uint32_t n) {
  if (!n) return "unlimited";
  char *s = slot();
  snprintf(s, 64, "%" PRIu32, n);
  return s;
}

static const char *ftime(int64_t t) {
  if (t <= 0) return "-";
  char *s = slot();
  time_t tt = (time_t)t;
  struct tm tm;
  if (!localtime_r(&tt, &tm) || !strftime(s, 64, "%Y-%m-%d %H:%M:%S", &tm)) return "-";
  return s;
}

static const char *enum_name(const ProtobufCEnumDescriptor *d, int v) {
  const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(d, v);
  if (ev) return ev->name;
  char *s = slot();
  snprintf(s, 64, "%d", v);
  return s;
}

static const char *state_name(int s) { return enum_name(&gpushare__v1__job_state__descriptor, s); }
static const char *precision_name(int s) { return enum_name(&gpushare__v1__precision__descriptor, s); }

static const char *policy_name(int p) {
  return p == GPUSHARE__V1__POLICY__GROWTH ? "growth" : p == GPUSHARE__V1__POLICY__PREALLOCATE ? "preallocate" : "?";
}

static const char *ids_list(const uint32_t *v, size_t n) {
  if (n == 0) return "-";
  char *s = slot();
  size_t off = 0;
  for (size_t i = 0; i < n && off < 60; i++)
    off += (size_t)snprintf(s + off, 64 - off, "%s%" PRIu32, i ? "," : "", v[i]);
  if (off >= 60) strcpy(s + 56, "...");
  return s;
}

/* ------------------------------------------------- requests, one by one --- */

#define REQ(var, field, CASE, Type, INIT) \
  Gpushare__V1__Request var = GPUSHARE__V1__REQUEST__INIT; \
  Type field##_msg = INIT; \
  var.call_case = GPUSHARE__V1__REQUEST__CALL_##CASE; \
  var.field = &field##_msg

/* Check the result is the one asked for: a daemon that answers a different
 * call is a bug we want to hear about, not a crash. */
static int expect(Gpushare__V1__Response *r, int result_case) {
  if ((int)r->result_case == result_case) return 0;
  fprintf(stderr, "gpuctl: INTERNAL: gpushared answered with another call's result (case %d, expected %d)\n",
          (int)r->result_case, result_case);
  return EXIT_FAIL;
}

/* Run one call whose answer is printed as JSON or by `human`. */
static int simple(cli *x, Gpushare__V1__Request *req, int result_case,
                  void (*human)(cli *x, const Gpushare__V1__Response *r)) {
  Gpushare__V1__Response *r;
  int rc = call(x, req, &r);
  if (!rc) rc = expect(r, result_case);
  if (!rc) {
    if (x->json) {
      /* the result member of the oneof is the message to print */
      const ProtobufCFieldDescriptor *f =
          protobuf_c_message_descriptor_get_field(&gpushare__v1__response__descriptor, (unsigned)result_case);
      print_json(*(ProtobufCMessage *const *)((const char *)r + f->offset));
    } else {
      human(x, r);
    }
  }
  gs_client_free_response(r);
  return rc;
}

/* --------------------------------------------------------------- devices --- */

static void devices_human(cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  table t = {0};
  table_header(&t, (1u << 3) | (1u << 4) | (1u << 5) | (1u << 6) | (1u << 7),
               (const char *const[]){"NAME", "KIND", "MODEL", "TOTAL", "USABLE", "ALLOCATED", "COMPUTE", "VDEVS",
                                     "CC", "OVERSUB", NULL});
  const Gpushare__V1__ListDevicesResponse *l = r->list_devices;
  for (size_t i = 0; i < l->n_device; i++) {
    const Gpushare__V1__Device *d = l->device[i];
    table_cell(&t, "%s", d->name ? d->name : "");
    table_cell(&t, "%s", d->kind ? d->kind : "");
    table_cell(&t, "%s", d->model && *d->model ? d->model : "-");
    table_cell(&t, "%s", fsize(d->total_bytes));
    table_cell(&t, "%s", fsize(d->usable_bytes));
    table_cell(&t, "%s", fsize(d->allocated_bytes));
    table_cell(&t, "%" PRIu32 "%%", d->compute_allocated);
    table_cell(&t, "%" PRIu32, d->vdev_count);
    table_cell(&t, "%s", d->compute_capability && *d->compute_capability ? d->compute_capability : "-");
    table_cell(&t, "%s", d->oversubscribed ? "yes" : "no");
  }
  table_print(&t);
}

static int cmd_devices(cli *x, parsed *p) {
  (void)p;
  REQ(req, list_devices, LIST_DEVICES, Gpushare__V1__ListDevicesRequest, GPUSHARE__V1__LIST_DEVICES_REQUEST__INIT);
  return simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_LIST_DEVICES, devices_human);
}

/* ------------------------------------------------------------------ vdev --- */

static void vdev_row(table *t, const Gpushare__V1__Vdev *v) {
  table_cell(t, "%s", v->name ? v->name : "");
  table_cell(t, "%s", v->device ? v->device : "");
  table_cell(t, "%s", v->tenant ? v->tenant : "");
  table_cell(t, "%s", fsize(v->memory_limit));
  table_cell(t, "%" PRIu32 "%%", v->compute_share);
  table_cell(t, "%s", policy_name(v->policy));
  table_cell(t, "%s", fsize(v->memory_in_use));
  table_cell(t, "%s", fsize(v->memory_reserved));
  table_cell(t, "%s", fsize(v->memory_peak));
  table_cell(t, "%s", ftime(v->created_unix));
}

static const char *const vdev_cols[] = {"NAME", "DEVICE", "TENANT", "LIMIT", "COMPUTE", "POLICY",
                                        "IN-USE", "RESERVED", "PEAK", "CREATED", NULL};
#define VDEV_RIGHT ((1u << 3) | (1u << 4) | (1u << 6) | (1u << 7) | (1u << 8))

static void vdev_create_human(cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  const Gpushare__V1__Vdev *v = r->create_vdev->vdev;
  if (!v) {
    printf("vdev created\n");
    return;
  }
  printf("vdev %s created on %s for tenant %s: %s, compute %" PRIu32 "%%, %s\n", v->name ? v->name : "?",
         v->device ? v->device : "?", v->tenant ? v->tenant : "?", fsize(v->memory_limit),
         v->compute_share, policy_name(v->policy));
}

static int cmd_vdev_create(cli *x, parsed *p) {
  REQ(req, create_vdev, CREATE_VDEV, Gpushare__V1__CreateVdevRequest, GPUSHARE__V1__CREATE_VDEV_REQUEST__INIT);
  create_vdev_msg.name = (char *)p->pos[0];
  if (p->nval[0]) create_vdev_msg.device = (char *)p->val[0][0];
  if (parse_size(x, "--memory", p->val[1][0], &create_vdev_msg.memory_limit)) return EXIT_USAGE;
  create_vdev_msg.has_memory_limit = 1;
  if (p->nval[2]) {
    if (parse_u32(x, "--compute", p->val[2][0], 1, 100, &create_vdev_msg.compute_share)) return EXIT_USAGE;
    create_vdev_msg.has_compute_share = 1;
  }
  if (p->nval[3]) {
    const char *pol = p->val[3][0];
    if (!strcasecmp(pol, "preallocate")) create_vdev_msg.policy = GPUSHARE__V1__POLICY__PREALLOCATE;
    else if (!strcasecmp(pol, "growth")) create_vdev_msg.policy = GPUSHARE__V1__POLICY__GROWTH;
    else return usage_error(x, "--policy: \"%s\" is not a policy; expected preallocate or growth", pol);
    create_vdev_msg.has_policy = 1;
  }
  create_vdev_msg.tenant = (char *)p->val[4][0];
  return simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_CREATE_VDEV, vdev_create_human);
}

static void vdev_list_human(cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  table t = {0};
  table_header(&t, VDEV_RIGHT, vdev_cols);
  for (size_t i = 0; i < r->list_vdevs->n_vdev; i++) vdev_row(&t, r->list_vdevs->vdev[i]);
  table_print(&t);
}

static int cmd_vdev_list(cli *x, parsed *p) {
  (void)p;
  REQ(req, list_vdevs, LIST_VDEVS, Gpushare__V1__ListVdevsRequest, GPUSHARE__V1__LIST_VDEVS_REQUEST__INIT);
  return simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_LIST_VDEVS, vdev_list_human);
}

static const char *deleted_what, *deleted_name;

static void deleted_human(cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  (void)r;
  printf("%s %s deleted\n", deleted_what, deleted_name);
}

static int cmd_vdev_delete(cli *x, parsed *p) {
  REQ(req, delete_vdev, DELETE_VDEV, Gpushare__V1__DeleteVdevRequest, GPUSHARE__V1__DELETE_VDEV_REQUEST__INIT);
  delete_vdev_msg.name = (char *)p->pos[0];
  deleted_what = "vdev";
  deleted_name = p->pos[0];
  return simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_DELETE_VDEV, deleted_human);
}

/* ---------------------------------------------------------------- tenant --- */

/* --memory, --compute, --max-running, --max-queued at flag indices first..first+3. */
static int parse_quota(cli *x, parsed *p, int first, Gpushare__V1__Quota *q, int *any) {
  *any = 0;
  if (p->nval[first]) {
    if (parse_size(x, "--memory", p->val[first][0], &q->memory_bytes)) return EXIT_USAGE;
    q->has_memory_bytes = 1;
    *any = 1;
  }
  if (p->nval[first + 1]) {
    if (parse_u32(x, "--compute", p->val[first + 1][0], 0, UINT32_MAX, &q->compute_share)) return EXIT_USAGE;
    q->has_compute_share = 1;
    *any = 1;
  }
  if (p->nval[first + 2]) {
    if (parse_u32(x, "--max-running", p->val[first + 2][0], 0, UINT32_MAX, &q->max_running)) return EXIT_USAGE;
    q->has_max_running = 1;
    *any = 1;
  }
  if (p->nval[first + 3]) {
    if (parse_u32(x, "--max-queued", p->val[first + 3][0], 0, UINT32_MAX, &q->max_queued)) return EXIT_USAGE;
    q->has_max_queued = 1;
    *any = 1;
  }
  return 0;
}

static void tenant_show(const Gpushare__V1__Tenant *t) {
  static const Gpushare__V1__Quota zero = GPUSHARE__V1__QUOTA__INIT;
  const Gpushare__V1__Quota *q = t->quota ? t->quota : &zero;
  printf("tenant:       %s\n", t->name ? t->name : "");
  printf("uids:         %s\n", ids_list(t->uids, t->n_uids));
  printf("gids:         %s\n", ids_list(t->gids, t->n_gids));
  printf("memory:       %s of %s\n", fsize(t->memory_allocated), fsize_or_unlimited(q->memory_bytes));
  printf("compute:      %" PRIu32 " of %s\n", t->compute_allocated, fcount_or_unlimited(q->compute_share));
  printf("max running:  %s\n", fcount_or_unlimited(q->max_running));
  printf("max queued:   %s\n", fcount_or_unlimited(q->max_queued));
  printf("vdevs:        %" PRIu32 "\n", t->vdev_count);
  if (t->created_unix) printf("created:      %s\n", ftime(t->created_unix));
}

static void tenant_create_human(cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  if (r->create_tenant->tenant) tenant_show(r->create_tenant->tenant);
  else printf("tenant created\n");
}

static int cmd_tenant_create(cli *x, parsed *p) {
  REQ(req, create_tenant, CREATE_TENANT, Gpushare__V1__CreateTenantRequest, GPUSHARE__V1__CREATE_TENANT_REQUEST__INIT);
  uint32_t uids[MAX_ARGS], gids[MAX_ARGS];
  Gpushare__V1__Quota q = GPUSHARE__V1__QUOTA__INIT;
  create_tenant_msg.name = (char *)p->pos[0];
  for (int i = 0; i < p->nval[0]; i++)
    if (parse_u32(x, "--uid", p->val[0][i], 0, UINT32_MAX - 1, &uids[i])) return EXIT_USAGE;
  for (int i = 0; i < p->nval[1]; i++)
    if (parse_u32(x, "--gid", p->val[1][i], 0, UINT32_MAX - 1, &gids[i])) return EXIT_USAGE;
  create_tenant_msg.n_uids = (size_t)p->nval[0];
  create_tenant_msg.uids = uids;
  create_tenant_msg.n_gids = (size_t)p->nval[1];
  create_tenant_msg.gids = gids;
  int any;
  if (parse_quota(x, p, 2, &q, &any)) return EXIT_USAGE;
  if (any) create_tenant_msg.quota = &q;
  return simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_CREATE_TENANT, tenant_create_human);
}

static void tenant_list_human(cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  static const Gpushare__V1__Quota zero = GPUSHARE__V1__QUOTA__INIT;
  table t = {0};
  table_header(&t, (1u << 3) | (1u << 4) | (1u << 5) | (1u << 6) | (1u << 7),
               (const char *const[]){"NAME", "UIDS", "GIDS", "MEMORY", "COMPUTE", "VDEVS", "MAX-RUNNING",
                                     "MAX-QUEUED", "CREATED", NULL});
  for (size_t i = 0; i < r->list_tenants->n_tenant; i++) {
    const Gpushare__V1__Tenant *tn = r->list_tenants->tenant[i];
    const Gpushare__V1__Quota *q = tn->quota ? tn->quota : &zero;
    table_cell(&t, "%s", tn->name ? tn->name : "");
    table_cell(&t, "%s", ids_list(tn->uids, tn->n_uids));
    table_cell(&t, "%s", ids_list(tn->gids, tn->n_gids));
    table_cell(&t, "%s / %s", fsize(tn->memory_allocated), fsize_or_unlimited(q->memory_bytes));
    table_cell(&t, "%" PRIu32 " / %s", tn->compute_allocated, fcount_or_unlimited(q->compute_share));
    table_cell(&t, "%" PRIu32, tn->vdev_count);
    table_cell(&t, "%s", fcount_or_unlimited(q->max_running));
    table_cell(&t, "%s", fcount_or_unlimited(q->max_queued));
    table_cell(&t, "%s", ftime(tn->created_unix));
  }
  table_print(&t);
}

static int cmd_tenant_list(cli *x, parsed *p) {
  (void)p;
  REQ(req, list_tenants, LIST_TENANTS, Gpushare__V1__ListTenantsRequest, GPUSHARE__V1__LIST_TENANTS_REQUEST__INIT);
  return simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_LIST_TENANTS, tenant_list_human);
}

static int cmd_tenant_delete(cli *x, parsed *p) {
  REQ(req, delete_tenant, DELETE_TENANT, Gpushare__V1__DeleteTenantRequest, GPUSHARE__V1__DELETE_TENANT_REQUEST__INIT);
  delete_tenant_msg.name = (char *)p->pos[0];
  deleted_what = "tenant";
  deleted_name = p->pos[0];
  return simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_DELETE_TENANT, deleted_human);
}

/* ----------------------------------------------------------------- quota --- */

static void quota_set_human(cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  if (r->set_quota->tenant) tenant_show(r->set_quota->tenant);
  else printf("quota set\n");
}

static int cmd_quota_set(cli *x, parsed *p) {
  REQ(req, set_quota, SET_QUOTA, Gpushare__V1__SetQuotaRequest, GPUSHARE__V1__SET_QUOTA_REQUEST__INIT);
  Gpushare__V1__Quota q = GPUSHARE__V1__QUOTA__INIT;
  set_quota_msg.tenant = (char *)p->pos[0];
  int any;
  if (parse_quota(x, p, 0, &q, &any)) return EXIT_USAGE;
  if (!any) return usage_error(x, "nothing to set; give at least one of --memory, --compute, --max-running, --max-queued");
  set_quota_msg.quota = &q;
  return simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_SET_QUOTA, quota_set_human);
}

static void quota_show_human(cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  if (r->get_quota->tenant) tenant_show(r->get_quota->tenant);
}

static int cmd_quota_show(cli *x, parsed *p) {
  REQ(req, get_quota, GET_QUOTA, Gpushare__V1__GetQuotaRequest, GPUSHARE__V1__GET_QUOTA_REQUEST__INIT);
  get_quota_msg.tenant = (char *)p->pos[0];
  return simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_GET_QUOTA, quota_show_human);
}

/* --------------------------------------------------------------- dataset --- */

static const char *base_name(const char *path) {
  const char *s = strrchr(path, '/');
  return s ? s + 1 : path;
}

static void dataset_row(table *t, const Gpushare__V1__DatasetInfo *d, int full_hash) {
  table_cell(t, "%s", d->name ? d->name : "");
  table_cell(t, "%s", d->tenant ? d->tenant : "");
  table_cell(t, "%s", fsize(d->bytes));
  table_cell(t, "%.*s", full_hash ? 64 : 16, d->sha256 ? d->sha256 : "");
  table_cell(t, "%s", ftime(d->created_unix));
}

static const char *const dataset_cols[] = {"NAME", "TENANT", "SIZE", "SHA256", "CREATED", NULL};

static int cmd_dataset_add(cli *x, parsed *p) {
  const char *name = p->pos[0];
  int nfiles = p->npos - 1;
  /* Every file must be readable before anything is uploaded. */
  for (int i = 1; i < p->npos; i++) {
    struct stat st;
    if (stat(p->pos[i], &st) < 0) return fail("cannot read %s: %s", p->pos[i], strerror(errno));
    if (!S_ISREG(st.st_mode)) return fail("cannot upload %s: not a regular file", p->pos[i]);
  }
  if (connect_daemon(x)) return EXIT_FAIL;
  table t = {0};
  table_header(&t, 1u << 2, dataset_cols);
  int rc = 0;
  json j = {.f = stdout};
  if (x->json) json_open(&j, NULL, '[');
  for (int i = 1; i < p->npos; i++) {
    /* The name goes to the daemon whole, however long: it says what is wrong
     * with it (a name cut here would be refused with a length it never had). */
    char *dsname = nfiles == 1 ? strdup(name) : NULL;
    if (nfiles != 1 && asprintf(&dsname, "%s.%s", name, base_name(p->pos[i])) < 0) dsname = NULL;
    if (!dsname) {
      table_free(&t);
      return fail("out of memory");
    }
    gs_err e = {0};
    Gpushare__V1__DatasetInfo *info = NULL;
    char hex[65];
    int urc = gs_client_upload_file(x->c, dsname, p->pos[i], hex, &info, &e);
    if (urc) {
      /* what was added before the failure is still shown */
      if (x->json) {
        json_close(&j, ']');
        fputc('\n', stdout);
      } else if (t.ncells > (size_t)t.ncols) {
        table_print(&t);
      }
      table_free(&t);
      report(urc, &e);
      fprintf(stderr, "gpuctl: dataset %.80s%s (%s) was not added\n", dsname,
              strlen(dsname) > 80 ? "..." : "", p->pos[i]);
      free(dsname);
      rc = EXIT_FAIL;
      break;
    }
    if (x->json) {
      if (info) json_message(&j, NULL, &info->base);
      else {
        json_open(&j, NULL, '{');
        json_str(&j, "name", dsname);
        json_str(&j, "sha256", hex);
        json_close(&j, '}');
      }
    } else if (info) {
      dataset_row(&t, info, 1);
    } else {
      table_cell(&t, "%s", dsname);
      table_cell(&t, "-");
      table_cell(&t, "-");
      table_cell(&t, "%s", hex);
      table_cell(&t, "-");
    }
    if (info) gpushare__v1__dataset_info__free_unpacked(info, NULL);
    free(dsname);
  }
  if (!rc) {
    if (x->json) {
      json_close(&j, ']');
      fputc('\n', stdout);
    } else {
      table_print(&t);
    }
  }
  return rc;
}

static void dataset_list_human(cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  table t = {0};
  table_header(&t, 1u << 2, dataset_cols);
  for (size_t i = 0; i < r->list_datasets->n_dataset; i++) dataset_row(&t, r->list_datasets->dataset[i], 0);
  table_print(&t);
}

static int cmd_dataset_list(cli *x, parsed *p) {
  (void)p;
  REQ(req, list_datasets, LIST_DATASETS, Gpushare__V1__ListDatasetsRequest, GPUSHARE__V1__LIST_DATASETS_REQUEST__INIT);
  return simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_LIST_DATASETS, dataset_list_human);
}

static int cmd_dataset_rm(cli *x, parsed *p) {
  REQ(req, remove_dataset, REMOVE_DATASET, Gpushare__V1__RemoveDatasetRequest, GPUSHARE__V1__REMOVE_DATASET_REQUEST__INIT);
  remove_dataset_msg.name = (char *)p->pos[0];
  deleted_what = "dataset";
  deleted_name = p->pos[0];
  return simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_REMOVE_DATASET, deleted_human);
}

/* ------------------------------------------------------------- job specs --- */

/* Read a whole file of at most GS_WIRE_MAX_FRAME bytes (a job spec is a few
 * kilobytes; anything larger could not be sent anyway). malloc'd. */
static int read_small_file(const char *path, uint8_t **out, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail("cannot read %s: %s", path, strerror(errno));
  uint8_t *buf = malloc(GS_WIRE_MAX_FRAME + 1);
  size_t n = 0;
  int rc = EXIT_FAIL;
  if (!buf) {
    fail("out of memory");
    goto fail_fd;
  }
  for (;;) {
    ssize_t k = read(fd, buf + n, GS_WIRE_MAX_FRAME + 1 - n);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) {
      fail("cannot read %s: %s", path, strerror(errno));
      goto fail_buf;
    }
    if (k == 0) break;
    n += (size_t)k;
    if (n > GS_WIRE_MAX_FRAME) {
      fail("%s is larger than %u bytes; a job spec is a few kilobytes", path, GS_WIRE_MAX_FRAME);
      goto fail_buf;
    }
  }
  *out = buf;
  *len = n;
  close(fd);
  return 0;
fail_buf:
  free(buf);
fail_fd:
  close(fd);
  return rc;
}

/* Unpack a binary JobSpec held in buf; on failure say what the file is
 * likely to be instead (a text spec is the usual mistake). */
static int unpack_spec(const char *path, const uint8_t *buf, size_t n, Gpushare__V1__JobSpec **out) {
  int text = n > 0;
  for (size_t i = 0; i < n && i < 256; i++)
    if (!isprint(buf[i]) && !isspace(buf[i])) text = 0;
  *out = text ? NULL : gpushare__v1__job_spec__unpack(NULL, n, buf);
  if (*out) return 0;
  if (text)
    return fail("%s is not a binary gpushare.v1.JobSpec (it looks like text); encode it with: "
                "gpuctl job encode %s", path, path);
  return fail("%s is not a binary gpushare.v1.JobSpec (%zu bytes that do not decode: truncated, or "
              "another message); encode a text spec with: gpuctl job encode JOB.txtpb", path, n);
}

/* Read a binary JobSpec (gpuctl job encode, or protoc --encode). */
static int read_spec(const char *path, Gpushare__V1__JobSpec **out) {
  uint8_t *buf = NULL;
  size_t n = 0;
  if (read_small_file(path, &buf, &n)) return EXIT_FAIL;
  int rc = unpack_spec(path, buf, n, out);
  free(buf);
  return rc;
}

/* ------------------------------------------------------------ job files --- */

/* A tenant writes a job as text protobuf and gpuctl turns it into the binary
 * JobSpec that submit sends, through protoc (the reference text-format
 * parser, with line and column in its messages) and gpushare.proto, looked
 * up where an install or a build tree puts it. What protoc writes is
 * decoded again with protobuf-c, the daemon's own decoder, before it is
 * renamed into place, so a JOB.pb that exists is one the daemon can read. */

/* dir of path (without the final slash) into out; "." when it has none. */
static void dir_of(const char *path, char *out, size_t n) {
  const char *s = strrchr(path, '/');
  if (!s) snprintf(out, n, ".");
  else if (s == path) snprintf(out, n, "/");
  else snprintf(out, n, "%.*s", (int)(s - path), path);
}

/* gpushare.proto: $GPUSHARE_PROTO, beside an installed gpuctl
 * (BIN/../share/gpushare), in the build tree (build/client/gpuctl ->
 * proto/), then /usr/share/gpushare. */
static int find_proto(char *out, size_t n) {
  const char *env = getenv("GPUSHARE_PROTO");
  if (env && *env) {
    if (access(env, R_OK) < 0) return fail("GPUSHARE_PROTO=%s: %s", env, strerror(errno));
    snprintf(out, n, "%s", env);
    return 0;
  }
  char exe[PATH_MAX] = "", bindir[PATH_MAX] = "";
  ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (k > 0) {
    exe[k] = '\0';
    dir_of(exe, bindir, sizeof bindir);
  }
  char cand[3][PATH_MAX + 64];
  int nc = 0;
  if (bindir[0]) {
    snprintf(cand[nc++], sizeof cand[0], "%s/../share/gpushare/gpushare.proto", bindir);
    snprintf(cand[nc++], sizeof cand[0], "%s/../../proto/gpushare.proto", bindir);
  }
  snprintf(cand[nc++], sizeof cand[0], "/usr/share/gpushare/gpushare.proto");
  for (int i = 0; i < nc; i++)
    if (access(cand[i], R_OK) == 0) {
      snprintf(out, n, "%s", cand[i]);
      return 0;
    }
  return fail("cannot find gpushare.proto (looked at $GPUSHARE_PROTO, %s, %s and "
              "/usr/share/gpushare/gpushare.proto); set GPUSHARE_PROTO to its path",
              nc > 1 ? cand[0] : "BIN/../share/gpushare/gpushare.proto",
              nc > 2 ? cand[1] : "BIN/../../proto/gpushare.proto");
}

/* protoc on $PATH, or an explanation of how to get it. */
static int find_protoc(char *out, size_t n, const char *verb) {
  const char *path = getenv("PATH");
  if (!path || !*path) path = "/usr/bin:/bin";
  for (const char *p = path; *p;) {
    const char *colon = strchr(p, ':');
    size_t len = colon ? (size_t)(colon - p) : strlen(p);
    if (len > 0 && len < PATH_MAX) {
      snprintf(out, n, "%.*s/protoc", (int)len, p);
      if (access(out, X_OK) == 0) return 0;
    }
    if (!colon) break;
    p = colon + 1;
  }
  fprintf(stderr, "gpuctl job %s needs protoc (Debian: apt-get install protobuf-compiler)\n", verb);
  return EXIT_FAIL;
}

/* Run protoc MODE=gpushare.v1.JobSpec with stdin from in_fd and stdout to
 * out_fd. Its messages name "input"; they are printed naming src instead.
 * 0 when protoc succeeded. */
static int run_protoc(const char *mode, int in_fd, int out_fd, const char *src) {
  char protoc[PATH_MAX + 16], proto[PATH_MAX + 64], pdir[PATH_MAX + 64];
  if (find_protoc(protoc, sizeof protoc, !strcmp(mode, "--encode") ? "encode" : "show") || find_proto(proto, sizeof proto)) return EXIT_FAIL;
  dir_of(proto, pdir, sizeof pdir);
  char a_mode[64], a_path[PATH_MAX + 80];
  snprintf(a_mode, sizeof a_mode, "%s=gpushare.v1.JobSpec", mode);
  snprintf(a_path, sizeof a_path, "--proto_path=%s", pdir);
  char *args[] = {protoc, a_mode, a_path, (char *)base_name(proto), NULL};
  int ep[2];
  if (pipe(ep) < 0) return fail("cannot run protoc: %s", strerror(errno));
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) {
    close(ep[0]);
    close(ep[1]);
    return fail("cannot run protoc: %s", strerror(errno));
  }
  if (pid == 0) {
    if (dup2(in_fd, STDIN_FILENO) < 0 || dup2(out_fd, STDOUT_FILENO) < 0 || dup2(ep[1], STDERR_FILENO) < 0)
      _exit(127);
    close(ep[0]);
    execv(protoc, args);
    dprintf(STDERR_FILENO, "cannot run %s: %s\n", protoc, strerror(errno));
    _exit(127);
  }
  close(ep[1]);
  char msg[16384];
  size_t got = 0;
  for (;;) {
    ssize_t k = read(ep[0], msg + got, sizeof msg - 1 - got);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    got += (size_t)k;
    if (got == sizeof msg - 1) { /* keep draining so protoc never blocks */
      char sink[4096];
      while (read(ep[0], sink, sizeof sink) > 0) {}
      break;
    }
  }
  msg[got] = '\0';
  close(ep[0]);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  int ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
  /* "input:3:7: Expected integer, got: oops" -> "job.txtpb:3:7: ..." */
  for (char *line = msg, *next; line && *line; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = '\0';
    if (!strcmp(line, "Failed to parse input.")) continue;
    if (!strncmp(line, "input:", 6)) fprintf(stderr, "%s:%s\n", src, line + 6);
    else fprintf(stderr, "%s: %s\n", src, line);
  }
  if (ok) return 0;
  if (!strcmp(mode, "--encode"))
    return fail("%s does not parse as a text gpushare.v1.JobSpec; nothing was written", src);
  return fail("protoc could not print %s", src);
}

/* JOB.txtpb -> JOB.pb: the extension after the last dot is replaced. */
static void default_pb_name(const char *in, char *out, size_t n) {
  const char *slash = strrchr(in, '/');
  const char *dot = strrchr(in, '.');
  if (dot && (!slash || dot > slash + 1)) snprintf(out, n, "%.*s.pb", (int)(dot - in), in);
  else snprintf(out, n, "%s.pb", in);
}

static int cmd_job_encode(cli *x, parsed *p) {
  const char *in = p->pos[0];
  char outbuf[PATH_MAX];
  const char *out = p->nval[0] ? p->val[0][0] : NULL;
  if (!out) {
    default_pb_name(in, outbuf, sizeof outbuf);
    out = outbuf;
  }
  if (!strcmp(out, in)) return usage_error(x, "the output would overwrite %s; name another with -o", in);
  int in_fd = open(in, O_RDONLY | O_CLOEXEC);
  if (in_fd < 0) return fail("cannot read %s: %s", in, strerror(errno));
  struct stat st;
  if (fstat(in_fd, &st) == 0 && !S_ISREG(st.st_mode)) {
    close(in_fd);
    return fail("cannot read %s: not a regular file", in);
  }
  /* Written beside the target and renamed at the end: a spec that does not
   * parse leaves no output, and an older JOB.pb stays as it was. */
  char tmp[PATH_MAX + 16];
  if (snprintf(tmp, sizeof tmp, "%s.partXXXXXX", out) >= (int)sizeof tmp) {
    close(in_fd);
    return fail("%s: path too long", out);
  }
  int fd = mkstemp(tmp);
  if (fd < 0) {
    int err = errno;
    close(in_fd);
    return fail("cannot write %s: %s", out, strerror(err));
  }
  int rc = run_protoc("--encode", in_fd, fd, in);
  close(in_fd);
  uint8_t *buf = NULL;
  size_t n = 0;
  Gpushare__V1__JobSpec *spec = NULL;
  if (rc) goto fail;
  rc = read_small_file(tmp, &buf, &n);
  if (rc) goto fail;
  spec = gpushare__v1__job_spec__unpack(NULL, n, buf);
  if (!spec) {
    rc = fail("protoc wrote %zu bytes for %s that protobuf-c cannot decode as a gpushare.v1.JobSpec "
              "(is the gpushare.proto it read the daemon's?); nothing was written", n, in);
    goto fail;
  }
  if (fchmod(fd, 0644) < 0 || fsync(fd) < 0) {
    rc = fail("cannot write %s: %s", out, strerror(errno));
    goto fail;
  }
  if (rename(tmp, out) < 0) {
    rc = fail("cannot write %s: %s", out, strerror(errno));
    goto fail;
  }
  size_t layers = spec->model ? spec->model->n_layer : 0;
  if (x->json) {
    json j = {.f = stdout};
    json_open(&j, NULL, '{');
    json_str(&j, "file", out);
    json_u64(&j, "bytes", n);
    json_str(&j, "name", spec->name ? spec->name : "");
    json_u64(&j, "layers", layers);
    json_close(&j, '}');
    fputc('\n', stdout);
  } else {
    printf("%s: %zu bytes, job \"%s\", %zu layer%s\n", out, n, spec->name ? spec->name : "", layers,
           layers == 1 ? "" : "s");
  }
  gpushare__v1__job_spec__free_unpacked(spec, NULL);
  free(buf);
  close(fd);
  return 0;
fail:
  if (spec) gpushare__v1__job_spec__free_unpacked(spec, NULL);
  free(buf);
  close(fd);
  unlink(tmp);
  return rc ? rc : EXIT_FAIL;
}

static int cmd_job_show(cli *x, parsed *p) {
  const char *path = p->pos[0];
  uint8_t *buf = NULL;
  size_t n = 0;
  if (read_small_file(path, &buf, &n)) return EXIT_FAIL;
  Gpushare__V1__JobSpec *spec;
  int rc = unpack_spec(path, buf, n, &spec);
  free(buf);
  if (rc) return rc;
  if (x->json) {
    print_json(&spec->base);
    gpushare__v1__job_spec__free_unpacked(spec, NULL);
    return 0;
  }
  gpushare__v1__job_spec__free_unpacked(spec, NULL);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail("cannot read %s: %s", path, strerror(errno));
  rc = run_protoc("--decode", fd, STDOUT_FILENO, path);
  close(fd);
  return rc;
}

/* Datasets already in the store, listed once per submit. */
typedef struct store_list {
  Gpushare__V1__Response *resp;
  int loaded;
} store_list;

static int have_sha(cli *x, store_list *s, const char *hex) {
  if (!s->loaded) {
    s->loaded = 1;
    REQ(req, list_datasets, LIST_DATASETS, Gpushare__V1__ListDatasetsRequest, GPUSHARE__V1__LIST_DATASETS_REQUEST__INIT);
    gs_err e = {0};
    if (gs_client_call(x->c, &req, &s->resp, &e)) {
      gs_client_free_response(s->resp); /* not fatal: we just upload */
      s->resp = NULL;
    }
  }
  if (!s->resp || s->resp->result_case != GPUSHARE__V1__RESPONSE__RESULT_LIST_DATASETS) return 0;
  for (size_t i = 0; i < s->resp->list_datasets->n_dataset; i++) {
    const char *h = s->resp->list_datasets->dataset[i]->sha256;
    if (h && !strcasecmp(h, hex)) return 1;
  }
  return 0;
}

/* Turn one idx path of the spec into "sha256:HEX"; with upload, make sure the
 * store has the bytes (uploading as dataset basename, or basename-SHA12 when
 * that name holds other bytes). */
static int resolve_path(cli *x, store_list *s, const char *field, char **slotp, int upload) {
  char *path = *slotp;
  if (!path || !*path || !strncmp(path, "sha256:", 7)) return 0;
  /* A local file is uploaded; a bare name that is no file here is one of
   * the tenant's datasets (gpuctl dataset add NAME FILE), which the daemon
   * looks up itself. "./NAME" always means the file. */
  struct stat st;
  if (stat(path, &st) < 0 && errno == ENOENT && !strchr(path, '/')) return 0;
  gs_err e = {0};
  char hex[65];
  uint64_t bytes = 0;
  if (gs_client_sha256_file(path, hex, &bytes, &e))
    return fail("%s: %s", field, e.msg);
  if (upload) {
    if (!have_sha(x, s, hex)) {
      if (!x->json) fprintf(stderr, "uploading %s (%s) as %s\n", path, fsize(bytes), base_name(path));
      char got[65];
      int rc = gs_client_upload_file(x->c, base_name(path), path, got, NULL, &e);
      if (rc == GS_CLIENT_REFUSED && e.code == GS_ALREADY_EXISTS) {
        char alt[300];
        snprintf(alt, sizeof alt, "%s-%.12s", base_name(path), hex);
        gs_err_clear(&e);
        rc = gs_client_upload_file(x->c, alt, path, got, NULL, &e);
        if (rc == GS_CLIENT_REFUSED && e.code == GS_ALREADY_EXISTS) rc = 0; /* same bytes, same name */
        else if (!rc) snprintf(hex, sizeof hex, "%s", got);
      } else if (!rc) {
        snprintf(hex, sizeof hex, "%s", got);
      }
      if (rc) {
        report(rc, &e);
        return fail("%s: could not upload %s", field, path);
      }
    }
  }
  char *ref = malloc(7 + 64 + 1);
  if (!ref) return fail("out of memory");
  snprintf(ref, 72, "sha256:%s", hex);
  free(path); /* unpacked with the default allocator */
  *slotp = ref;
  return 0;
}

static int resolve_dataset(cli *x, store_list *s, const char *which, Gpushare__V1__Dataset *d, int upload) {
  if (!d || d->source_case != GPUSHARE__V1__DATASET__SOURCE_IDX || !d->idx) return 0;
  char f[64];
  snprintf(f, sizeof f, "spec.%s.idx.images", which);
  if (resolve_path(x, s, f, &d->idx->images, upload)) return EXIT_FAIL;
  snprintf(f, sizeof f, "spec.%s.idx.labels", which);
  if (resolve_path(x, s, f, &d->idx->labels, upload)) return EXIT_FAIL;
  return 0;
}

static int resolve_spec(cli *x, Gpushare__V1__JobSpec *spec, int upload) {
  store_list s = {0};
  int rc = resolve_dataset(x, &s, "train", spec->train, upload);
  if (!rc) rc = resolve_dataset(x, &s, "test", spec->test, upload);
  gs_client_free_response(s.resp);
  return rc;
}

/* ------------------------------------------------------------------ plan --- */

static void plan_print(FILE *f, const Gpushare__V1__Plan *pl) {
  if (pl->summary && *pl->summary) {
    fputs(pl->summary, f);
    if (pl->summary[strlen(pl->summary) - 1] != '\n') fputc('\n', f);
  } else {
    table t = {0};
    table_header(&t, 0x7f8u, (const char *const[]){"LAYER", "KIND", "OUTPUT", "PARAMS", "WEIGHTS", "MASTER",
                                                  "GRADIENTS", "OPTIMIZER", "ACTIVATIONS", "WORKSPACE", "BATCH", NULL});
    for (size_t i = 0; i < pl->n_row; i++) {
      const Gpushare__V1__PlanRow *r = pl->row[i];
      table_cell(&t, "%s", r->layer ? r->layer : "");
      table_cell(&t, "%s", r->kind ? r->kind : "");
      table_cell(&t, "%s", r->output_shape ? r->output_shape : "");
      table_cell(&t, "%" PRIu64, r->parameters);
      table_cell(&t, "%s", fsize(r->weights_bytes));
      table_cell(&t, "%s", fsize(r->master_bytes));
      table_cell(&t, "%s", fsize(r->gradient_bytes));
      table_cell(&t, "%s", fsize(r->optimizer_bytes));
      table_cell(&t, "%s", fsize(r->activation_bytes));
      table_cell(&t, "%s", fsize(r->workspace_bytes));
      table_cell(&t, "%s", fsize(r->batch_bytes));
    }
    table_fprint(f, &t);
  }
  fprintf(f, "parameters: %" PRIu64 "\n", pl->parameters);
  fprintf(f, "precision: %s, micro-batch %" PRIu32 " x %" PRIu32 " accumulation steps\n",
          precision_name(pl->precision), pl->micro_batch, pl->accumulation_steps);
  if (pl->limit_bytes)
    fprintf(f, "peak: %s of a %s limit: %s\n", fsize(pl->peak_bytes), fsize(pl->limit_bytes),
            pl->fits ? "fits" : "does NOT fit");
  else
    fprintf(f, "peak: %s\n", fsize(pl->peak_bytes));
}

static void plan_human(cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  if (r->plan_result->plan) plan_print(stdout, r->plan_result->plan);
}

static int cmd_plan(cli *x, parsed *p) {
  Gpushare__V1__JobSpec *spec;
  if (read_spec(p->pos[0], &spec)) return EXIT_FAIL;
  int rc = connect_daemon(x); /* before hashing: a stopped daemon is said at once */
  if (!rc) rc = resolve_spec(x, spec, 0);
  if (!rc) {
    REQ(req, plan, PLAN, Gpushare__V1__PlanRequest, GPUSHARE__V1__PLAN_REQUEST__INIT);
    plan_msg.spec = spec;
    if (p->nval[0]) plan_msg.vdev = (char *)p->val[0][0];
    rc = simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_PLAN_RESULT, plan_human);
  }
  gpushare__v1__job_spec__free_unpacked(spec, NULL);
  return rc;
}

/* ------------------------------------------------------------------ jobs --- */

static int watch_job(cli *x, uint64_t id);

static int cmd_submit(cli *x, parsed *p) {
  Gpushare__V1__JobSpec *spec;
  if (read_spec(p->pos[0], &spec)) return EXIT_FAIL;
  int rc = EXIT_FAIL;
  uint64_t id = 0;
  if (connect_daemon(x)) goto out;
  rc = resolve_spec(x, spec, 1);
  if (rc) goto out;
  REQ(req, submit, SUBMIT, Gpushare__V1__SubmitRequest, GPUSHARE__V1__SUBMIT_REQUEST__INIT);
  submit_msg.spec = spec;
  Gpushare__V1__Response *r;
  rc = call(x, &req, &r);
  if (rc) {
    /* a job that does not fit is refused with the plan that says why */
    if (r && r->plan) plan_print(stderr, r->plan);
    gs_client_free_response(r);
    goto out;
  }
  rc = expect(r, GPUSHARE__V1__RESPONSE__RESULT_SUBMIT);
  if (!rc) {
    const Gpushare__V1__Job *j = r->submit->job;
    id = j ? j->id : 0;
    if (x->json) {
      print_json(&r->submit->base);
    } else if (j) {
      printf("job %" PRIu64 " submitted", j->id);
      if (j->name && *j->name) printf(" (%s)", j->name);
      printf(": vdev %s, %s", j->vdev ? j->vdev : "?", state_name(j->state));
      if (j->planned_peak_bytes) printf(", planned peak %s", fsize(j->planned_peak_bytes));
      if (j->micro_batch) printf(", micro-batch %" PRIu32 " x %" PRIu32, j->micro_batch, j->accumulation_steps);
      printf("\n");
    }
  }
  gs_client_free_response(r);
  if (!rc && p->nval[0]) {
    if (!id) rc = fail("the daemon did not say which job it created; cannot watch it");
    else {
      fflush(stdout);
      rc = watch_job(x, id);
    }
  }
out:
  gpushare__v1__job_spec__free_unpacked(spec, NULL);
  return rc;
}

static const char *oom_cause_text(int c) {
  switch (c) {
    case GPUSHARE__V1__OOM_CAUSE__QUOTA: return "QUOTA: the vdev's memory limit is reached";
    case GPUSHARE__V1__OOM_CAUSE__PHYSICAL: return "PHYSICAL: the physical device has no more memory";
    case GPUSHARE__V1__OOM_CAUSE__FRAGMENTATION:
      return "FRAGMENTATION: enough free bytes in total, but no free block large enough";
    default: return enum_name(&gpushare__v1__oom_cause__descriptor, c);
  }
}

/* An OomReport as a reader wants it: what could not be placed, the vdev as
 * it stood, why, and what would fit. */
static void oom_print(FILE *f, const Gpushare__V1__OomReport *o) {
  fprintf(f, "\nout of memory:\n");
  fprintf(f, "  tensor:       layer %s, %s %s %s, %s\n", o->layer && *o->layer ? o->layer : "?",
          o->role && *o->role ? o->role : "?", o->shape && *o->shape ? o->shape : "?",
          o->dtype && *o->dtype ? o->dtype : "?", fsize(o->bytes));
  fprintf(f, "  vdev:         %s: limit %s, in use %s, reserved %s\n", o->vdev && *o->vdev ? o->vdev : "?",
          fsize(o->limit_bytes), fsize(o->in_use_bytes), fsize(o->reserved_bytes));
  fprintf(f, "                largest free block %s, fragmentation %.1f%%\n", fsize(o->largest_free_bytes),
          100.0 * o->fragmentation);
  fprintf(f, "  cause:        %s\n", oom_cause_text(o->cause));
  if (o->explanation && *o->explanation) fprintf(f, "  explanation:  %s\n", o->explanation);
  for (size_t i = 0; i < o->n_suggestion; i++) {
    const Gpushare__V1__OomSuggestion *s = o->suggestion[i];
    fprintf(f, "  %s %s", i ? "              " : "suggestions: ", s->what ? s->what : "");
    if (s->predicted_peak_bytes)
      fprintf(f, " (predicted peak %s, saves %s)", fsize(s->predicted_peak_bytes), fsize(s->saving_bytes));
    fputc('\n', f);
  }
}

static void job_show(const Gpushare__V1__Job *j) {
  printf("job:          %" PRIu64 "\n", j->id);
  if (j->name && *j->name) printf("name:         %s\n", j->name);
  printf("tenant:       %s\n", j->tenant ? j->tenant : "");
  printf("vdev:         %s%s%s%s\n", j->vdev ? j->vdev : "", j->device && *j->device ? " (device " : "",
         j->device && *j->device ? j->device : "", j->device && *j->device ? ")" : "");
  printf("state:        %s%s\n", state_name(j->state),
         j->cancel_requested && j->state == GPUSHARE__V1__JOB_STATE__RUNNING
             ? " (cancel requested: stops at its next step)"
             : "");
  if (j->reason && *j->reason) printf("reason:       %s\n", j->reason);
  printf("priority:     %" PRId32 "\n", j->priority);
  printf("submitted:    %s\n", ftime(j->submitted_unix));
  if (j->started_unix) printf("started:      %s\n", ftime(j->started_unix));
  if (j->finished_unix) printf("finished:     %s\n", ftime(j->finished_unix));
  if (j->total_steps)
    printf("step:         %" PRIu64 " of %" PRIu64 " (%.1f%%)\n", j->step, j->total_steps,
           100.0 * (double)j->step / (double)j->total_steps);
  else
    printf("step:         %" PRIu64 "\n", j->step);
  if (j->micro_batch)
    printf("batch:        micro-batch %" PRIu32 " x %" PRIu32 " accumulation steps\n", j->micro_batch,
           j->accumulation_steps);
  if (j->spec) printf("precision:    %s\n", precision_name(j->spec->precision));
  if (j->planned_peak_bytes) printf("planned peak: %s\n", fsize(j->planned_peak_bytes));
  if (j->restarts) printf("restarts:     %" PRIu32 " (executor deaths it lived through)\n", j->restarts);
  if (j->n_epoch) {
    printf("\n");
    table t = {0};
    table_header(&t, 0xffu, (const char *const[]){"EPOCH", "TRAIN-LOSS", "TEST-LOSS", "TEST-ACC", "SAMPLES/S",
                                                 "PEAK-MEM", "LOSS-SCALE", "SKIPPED", NULL});
    for (size_t i = 0; i < j->n_epoch; i++) {
      const Gpushare__V1__EpochMetrics *m = j->epoch[i];
      table_cell(&t, "%" PRIu32, m->epoch);
      table_cell(&t, "%.4f", m->train_loss);
      table_cell(&t, "%.4f", m->test_loss);
      table_cell(&t, "%.2f%%", 100.0 * m->test_accuracy);
      table_cell(&t, "%.0f", m->samples_per_second);
      table_cell(&t, "%s", fsize(m->peak_memory_bytes));
      /* fp32 and bf16 epochs report a scale of 1: only fp16 has one */
      table_cell(&t, m->has_loss_scale && m->loss_scale != 1.0f ? "%g" : "-", m->loss_scale);
      table_cell(&t, "%" PRIu64, m->skipped_steps);
    }
    table_print(&t);
  }
  if (j->oom) oom_print(stdout, j->oom);
}

static void status_human(cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  if (r->job_status->job) job_show(r->job_status->job);
}

static int cmd_status(cli *x, parsed *p) {
  REQ(req, job_status, JOB_STATUS, Gpushare__V1__JobStatusRequest, GPUSHARE__V1__JOB_STATUS_REQUEST__INIT);
  if (parse_job_id(x, p->pos[0], &job_status_msg.id)) return EXIT_USAGE;
  job_status_msg.has_id = 1;
  return simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_JOB_STATUS, status_human);
}

static void list_human(cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  table t = {0};
  table_header(&t, (1u << 0) | (1u << 5) | (1u << 6),
               (const char *const[]){"ID", "NAME", "TENANT", "VDEV", "STATE", "STEP", "PEAK", "SUBMITTED", NULL});
  for (size_t i = 0; i < r->list_jobs->n_job; i++) {
    const Gpushare__V1__Job *j = r->list_jobs->job[i];
    table_cell(&t, "%" PRIu64, j->id);
    table_cell(&t, "%s", j->name && *j->name ? j->name : "-");
    table_cell(&t, "%s", j->tenant ? j->tenant : "");
    table_cell(&t, "%s", j->vdev ? j->vdev : "");
    table_cell(&t, "%s", state_name(j->state));
    if (j->total_steps) table_cell(&t, "%" PRIu64 "/%" PRIu64, j->step, j->total_steps);
    else table_cell(&t, "%" PRIu64, j->step);
    table_cell(&t, "%s", j->planned_peak_bytes ? fsize(j->planned_peak_bytes) : "-");
    table_cell(&t, "%s", ftime(j->submitted_unix));
  }
  table_print(&t);
}

static int cmd_list(cli *x, parsed *p) {
  REQ(req, list_jobs, LIST_JOBS, Gpushare__V1__ListJobsRequest, GPUSHARE__V1__LIST_JOBS_REQUEST__INIT);
  if (p->nval[0]) {
    list_jobs_msg.has_all = 1;
    list_jobs_msg.all = 1;
  }
  return simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_LIST_JOBS, list_human);
}

/* One line describing an event: "job 7 RUNNING epoch 1 step 340/1875 ...". */
static void event_line(const Gpushare__V1__JobEvent *ev, char *buf, size_t n) {
  size_t off = 0;
#define ADD(...) \
  do { \
    if (off < n) off += (size_t)snprintf(buf + off, n - off, __VA_ARGS__); \
  } while (0)
  ADD("job %" PRIu64 " %s", ev->job_id, state_name(ev->state));
  if (ev->has_epoch) ADD("  epoch %" PRIu32, ev->epoch);
  if (ev->has_step) {
    if (ev->total_steps) ADD("  step %" PRIu64 "/%" PRIu64 " (%.1f%%)", ev->step, ev->total_steps,
                             100.0 * (double)ev->step / (double)ev->total_steps);
    else ADD("  step %" PRIu64, ev->step);
  }
  if (ev->has_loss) ADD("  loss %.4f", ev->loss);
  if (ev->has_accuracy) ADD("  acc %.2f%%", 100.0 * ev->accuracy);
  if (ev->has_samples_per_second) ADD("  %.0f samples/s", ev->samples_per_second);
  if (ev->has_memory_in_use) {
    ADD("  mem %s", fsize(ev->memory_in_use));
    if (ev->memory_limit) ADD(" / %s", fsize(ev->memory_limit));
  }
  if (ev->has_loss_scale) ADD("  scale %g", ev->loss_scale);
  const Gpushare__V1__EpochMetrics *m = ev->epoch_end;
  if (m)
    ADD("  epoch %" PRIu32 " done: train loss %.4f, test loss %.4f, test accuracy %.2f%%, peak %s", m->epoch,
        m->train_loss, m->test_loss, 100.0 * m->test_accuracy, fsize(m->peak_memory_bytes));
  if (ev->message && *ev->message) ADD("  %s", ev->message);
#undef ADD
}

/* What gpuctl watch shows, and how (see watch_job). */
typedef struct watch_view {
  int tty;             /* stdout is a terminal: one live line */
  int cols;            /* its width (the live line is cut to fit) */
  int live;            /* a live line is on screen, without its newline */
  double last_plain;   /* monotonic time of the last plain progress line */
  int have_acc;        /* an epoch has ended: acc is its test accuracy */
  float acc;
  int last_state;      /* -1 before the first event */
} watch_view;

#define WATCH_PLAIN_INTERVAL 5.0 /* seconds between two progress lines off a terminal */

static double mono_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* "job 7  epoch 2  step 340/1875 (18.1%)  loss 0.4123  acc 86.20%
 *  12345 samples/s  mem 1.20 MiB / 64.0 MiB  scale 32768" */
static void progress_line(const watch_view *v, const Gpushare__V1__JobEvent *ev, char *buf, size_t n) {
  size_t off = 0;
#define ADD(...) \
  do { \
    if (off < n) off += (size_t)snprintf(buf + off, n - off, __VA_ARGS__); \
  } while (0)
  ADD("job %" PRIu64, ev->job_id);
  if (ev->has_epoch) ADD("  epoch %" PRIu32, ev->epoch);
  if (ev->total_steps)
    ADD("  step %" PRIu64 "/%" PRIu64 " (%.1f%%)", ev->step, ev->total_steps,
        100.0 * (double)ev->step / (double)ev->total_steps);
  else if (ev->has_step)
    ADD("  step %" PRIu64, ev->step);
  if (ev->has_loss) ADD("  loss %.4f", ev->loss);
  if (v->have_acc) ADD("  acc %.2f%%", 100.0 * v->acc);
  if (ev->has_samples_per_second && ev->samples_per_second > 0) ADD("  %.0f samples/s", ev->samples_per_second);
  if (ev->has_memory_in_use) {
    ADD("  mem %s", fsize(ev->memory_in_use));
    if (ev->memory_limit) ADD(" / %s", fsize(ev->memory_limit));
  }
  /* fp16's dynamic loss scale; fp32 and bf16 report 1 (or nothing) */
  if (ev->has_loss_scale && ev->loss_scale > 0 && ev->loss_scale != 1.0f) ADD("  scale %g", ev->loss_scale);
#undef ADD
}

static void epoch_line(uint64_t id, const Gpushare__V1__EpochMetrics *m, char *buf, size_t n) {
  int k = snprintf(buf, n,
                   "job %" PRIu64 "  epoch %" PRIu32 " done: train loss %.4f, test loss %.4f, test accuracy %.2f%%, "
                   "%.0f samples/s, peak %s",
                   id, m->epoch, m->train_loss, m->test_loss, 100.0 * m->test_accuracy, m->samples_per_second,
                   fsize(m->peak_memory_bytes));
  if (k > 0 && (size_t)k < n && m->has_loss_scale && m->loss_scale > 0 && m->loss_scale != 1.0f)
    snprintf(buf + k, n - (size_t)k, ", loss scale %g, %" PRIu64 " skipped", m->loss_scale, m->skipped_steps);
}

/* A line that stays: it replaces the live line on a terminal. */
static void watch_put(watch_view *v, const char *line) {
  if (v->tty && v->live) fputs("\r\033[K", stdout);
  printf("%s\n", line);
  v->live = 0;
  fflush(stdout);
}

/* A progress line: live on a terminal, else at most every few seconds. */
static void watch_progress(watch_view *v, const char *line) {
  if (v->tty) {
    int w = v->cols > 1 ? v->cols - 1 : 79;
    printf("\r%.*s\033[K", w, line);
    v->live = 1;
  } else {
    double now = mono_now();
    if (v->last_plain > 0 && now - v->last_plain < WATCH_PLAIN_INTERVAL) return;
    v->last_plain = now;
    printf("%s\n", line);
  }
  fflush(stdout);
}

/* A state event's message without the "STATE: " the daemon puts first. */
static const char *event_reason(const Gpushare__V1__JobEvent *ev) {
  const char *m = ev->message;
  if (!m || !*m) return NULL;
  const char *st = state_name(ev->state);
  size_t n = strlen(st);
  if (!strncmp(m, st, n)) {
    if (!m[n]) return NULL;
    if (m[n] == ':' && m[n + 1] == ' ') return m + n + 2;
  }
  return m;
}

static void watch_event(watch_view *v, const Gpushare__V1__JobEvent *ev) {
  char line[1024];
  if (ev->epoch_end) {
    v->have_acc = 1;
    v->acc = ev->epoch_end->test_accuracy;
    epoch_line(ev->job_id, ev->epoch_end, line, sizeof line);
    watch_put(v, line);
  } else if (v->last_state < 0 || (int)ev->state != v->last_state) {
    /* the first event (the job as it stands) and every change of state */
    if (v->last_state < 0 && ev->has_accuracy && ev->has_epoch) {
      v->have_acc = 1;
      v->acc = ev->accuracy;
    }
    const char *why = event_reason(ev);
    int k = snprintf(line, sizeof line, "job %" PRIu64 " %s", ev->job_id, state_name(ev->state));
    if (k > 0 && (size_t)k < sizeof line && ev->step)
      k += snprintf(line + k, sizeof line - (size_t)k, " at step %" PRIu64 "/%" PRIu64, ev->step, ev->total_steps);
    if (k > 0 && (size_t)k < sizeof line && why) snprintf(line + k, sizeof line - (size_t)k, ": %s", why);
    watch_put(v, line);
  } else {
    progress_line(v, ev, line, sizeof line);
    watch_progress(v, line);
  }
  if (ev->has_state) v->last_state = (int)ev->state;
}

/* The job as the daemon has it after its end; NULL when it cannot be asked
 * (the final event then says how it ended). Freed with
 * gs_client_free_response. */
static Gpushare__V1__Response *ended_job(cli *x, uint64_t id) {
  REQ(req, job_status, JOB_STATUS, Gpushare__V1__JobStatusRequest, GPUSHARE__V1__JOB_STATUS_REQUEST__INIT);
  job_status_msg.has_id = 1;
  job_status_msg.id = id;
  Gpushare__V1__Response *r = NULL;
  gs_err e = {0};
  if (gs_client_call(x->c, &req, &r, &e) || r->result_case != GPUSHARE__V1__RESPONSE__RESULT_JOB_STATUS ||
      !r->job_status->job) {
    gs_client_free_response(r);
    return NULL;
  }
  return r;
}

/* Follow job id to its end. Exit 0 only when it SUCCEEDED. After the final
 * event the job is asked for once more: its record has the reason, the
 * epochs and, when it ran out of memory, the OomReport. */
static int watch_job(cli *x, uint64_t id) {
  if (connect_daemon(x)) return EXIT_FAIL;
  REQ(req, watch, WATCH, Gpushare__V1__WatchRequest, GPUSHARE__V1__WATCH_REQUEST__INIT);
  watch_msg.has_id = 1;
  watch_msg.id = id;
  gs_err e = {0};
  uint64_t rid;
  int rc = gs_client_send(x->c, &req, &rid, &e);
  if (rc) return report(rc, &e);
  watch_view v = {.tty = isatty(STDOUT_FILENO), .cols = 80, .last_state = -1};
  struct winsize ws;
  if (v.tty && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) v.cols = ws.ws_col;
  int final_state = -1;
  char final_msg[512] = "";
  for (;;) {
    Gpushare__V1__Response *r;
    rc = gs_client_recv(x->c, rid, &r, &e);
    if (rc) {
      if (v.live) fputc('\n', stdout);
      gs_client_free_response(r);
      report(rc, &e);
      return fail("lost the daemon while watching job %" PRIu64 "; gpuctl watch %" PRIu64 " follows it again",
                  id, id);
    }
    if (r->result_case != GPUSHARE__V1__RESPONSE__RESULT_WATCH) {
      gs_client_free_response(r);
      if (v.live) fputc('\n', stdout);
      return fail("INTERNAL: gpushared answered a watch with another call's result");
    }
    const Gpushare__V1__WatchResponse *w = r->watch;
    const Gpushare__V1__JobEvent *ev = w->event;
    int final = w->has_final && w->final;
    if (x->json) print_json(&w->base);
    else if (ev && !final) watch_event(&v, ev);
    if (final && ev) {
      final_state = ev->has_state ? (int)ev->state : -1;
      const char *why = event_reason(ev);
      if (why) snprintf(final_msg, sizeof final_msg, "%s", why);
    }
    gs_client_free_response(r);
    if (final) break;
  }
  if (v.live) fputc('\n', stdout);
  fflush(stdout);

  Gpushare__V1__Response *sr = ended_job(x, id);
  const Gpushare__V1__Job *j = sr ? sr->job_status->job : NULL;
  int st = j && j->has_state ? (int)j->state : final_state;
  const char *why = j && j->reason && *j->reason ? j->reason : final_msg[0] ? final_msg : NULL;
  if (!x->json) {
    /* the last line: how it ended, with the test accuracy of its last epoch */
    printf("job %" PRIu64 " %s", id, st >= 0 ? state_name(st) : "ended");
    if (j && j->step) printf(" at step %" PRIu64 "/%" PRIu64, j->step, j->total_steps);
    if (j && j->n_epoch) {
      const Gpushare__V1__EpochMetrics *m = j->epoch[j->n_epoch - 1];
      printf(" after %zu epoch%s: test accuracy %.2f%%, test loss %.4f", j->n_epoch, j->n_epoch == 1 ? "" : "s",
             100.0 * m->test_accuracy, m->test_loss);
    } else if (v.have_acc) {
      printf(": test accuracy %.2f%%", 100.0 * v.acc);
    }
    if (j && j->started_unix && j->finished_unix >= j->started_unix)
      printf(" (%" PRId64 " s)", j->finished_unix - j->started_unix);
    printf("\n");
    fflush(stdout);
  }
  int out = EXIT_OK;
  if (st != GPUSHARE__V1__JOB_STATE__SUCCEEDED) {
    out = EXIT_FAIL;
    if (st < 0) fprintf(stderr, "gpuctl: gpushared did not say how job %" PRIu64 " ended\n", id);
    else fprintf(stderr, "gpuctl: job %" PRIu64 " %s%s%s\n", id, state_name(st), why ? ": " : "", why ? why : "");
    if (j && j->oom) oom_print(stderr, j->oom);
  }
  gs_client_free_response(sr);
  return out;
}

static int cmd_watch(cli *x, parsed *p) {
  uint64_t id;
  if (parse_job_id(x, p->pos[0], &id)) return EXIT_USAGE;
  return watch_job(x, id);
}

static void cancel_human(cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  const Gpushare__V1__Job *j = r->cancel->job;
  if (j) printf("job %" PRIu64 ": %s%s%s\n", j->id, state_name(j->state), j->reason && *j->reason ? ": " : "",
                j->reason ? j->reason : "");
  else printf("cancel requested\n");
}

static int cmd_cancel(cli *x, parsed *p) {
  REQ(req, cancel, CANCEL, Gpushare__V1__CancelRequest, GPUSHARE__V1__CANCEL_REQUEST__INIT);
  if (parse_job_id(x, p->pos[0], &cancel_msg.id)) return EXIT_USAGE;
  cancel_msg.has_id = 1;
  return simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_CANCEL, cancel_human);
}

static void logs_human(cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  for (size_t i = 0; i < r->logs->n_event; i++) {
    const Gpushare__V1__JobEvent *ev = r->logs->event[i];
    char line[1024], ts[64] = "-";
    event_line(ev, line, sizeof line);
    if (ev->time_unix_ms > 0) {
      time_t t = (time_t)(ev->time_unix_ms / 1000);
      struct tm tm;
      if (localtime_r(&t, &tm)) {
        size_t k = strftime(ts, sizeof ts, "%Y-%m-%d %H:%M:%S", &tm);
        snprintf(ts + k, sizeof ts - k, ".%03d", (int)(ev->time_unix_ms % 1000));
      }
    }
    printf("%s  %s\n", ts, line);
  }
}

static int cmd_logs(cli *x, parsed *p) {
  REQ(req, logs, LOGS, Gpushare__V1__LogsRequest, GPUSHARE__V1__LOGS_REQUEST__INIT);
  if (parse_job_id(x, p->pos[0], &logs_msg.id)) return EXIT_USAGE;
  logs_msg.has_id = 1;
  return simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_LOGS, logs_human);
}

static int cmd_fetch(cli *x, parsed *p) {
  uint64_t id;
  if (parse_job_id(x, p->pos[0], &id)) return EXIT_USAGE;
  const char *out = p->val[0][0];
  int to_stdout = !strcmp(out, "-");
  if (to_stdout && x->json) return usage_error(x, "-o -: the download itself goes to stdout; --json has nothing to add");
  if (connect_daemon(x)) return EXIT_FAIL;
  /* Write beside the target and rename at the end, so a failed download
   * never leaves a truncated model under the name asked for. */
  char tmp[PATH_MAX];
  int fd = STDOUT_FILENO;
  if (!to_stdout) {
    if (snprintf(tmp, sizeof tmp, "%s.partXXXXXX", out) >= (int)sizeof tmp) return fail("%s: path too long", out);
    fd = mkstemp(tmp);
    if (fd < 0) return fail("cannot write %s: %s", out, strerror(errno));
  }
  gs_err e = {0};
  uint64_t total = 0;
  int rc = gs_client_fetch(x->c, id, p->nval[1] > 0, fd, &total, &e);
  if (rc) {
    if (!to_stdout) {
      close(fd);
      unlink(tmp);
    }
    return report(rc, &e);
  }
  if (!to_stdout) {
    if (fchmod(fd, 0644) < 0 || fsync(fd) < 0 || close(fd) < 0) {
      int err = errno;
      unlink(tmp);
      return fail("cannot write %s: %s", out, strerror(err));
    }
    if (rename(tmp, out) < 0) {
      int err = errno;
      unlink(tmp);
      return fail("cannot write %s: %s", out, strerror(err));
    }
  }
  if (x->json) {
    json j = {.f = stdout};
    json_open(&j, NULL, '{');
    json_u64(&j, "id", id);
    json_str(&j, "file", out);
    json_u64(&j, "bytes", total);
    json_bool(&j, "checkpoint", p->nval[1] > 0);
    json_close(&j, '}');
    fputc('\n', stdout);
  } else if (!to_stdout) {
    printf("job %" PRIu64 ": %s written to %s (%s)\n", id, p->nval[1] ? "checkpoint" : "weights", out, fsize(total));
  }
  return EXIT_OK;
}

#define CHART_ROWS 20  /* rows of the per-step chart; steps are grouped to fit */
#define CHART_WIDTH 50 /* characters of the longest bar */

/* Peak in use per step as horizontal bars, one row per group of steps (the
 * highest peak of the group), scaled to the larger of the measured and the
 * planned peak, with '|' where the planned peak lies. */
static void memory_chart(const Gpushare__V1__MemoryTimeline *tl) {
  size_t n = tl->n_step, rows = n < CHART_ROWS ? n : CHART_ROWS;
  uint64_t top = tl->planned_peak_bytes;
  for (size_t i = 0; i < n; i++)
    if (tl->step[i]->peak_in_use_bytes > top) top = tl->step[i]->peak_in_use_bytes;
  if (!top) top = 1;
  size_t plan_col = tl->planned_peak_bytes ? (size_t)((double)tl->planned_peak_bytes / (double)top * CHART_WIDTH) : 0;
  if (plan_col >= CHART_WIDTH) plan_col = CHART_WIDTH - 1;
  printf("\npeak in use by step (%s full scale", fsize(top));
  if (tl->planned_peak_bytes) printf("; | is the planned peak %s", fsize(tl->planned_peak_bytes));
  printf("):\n");
  for (size_t r = 0; r < rows; r++) {
    size_t lo = r * n / rows, hi = (r + 1) * n / rows; /* steps [lo, hi) of the list */
    uint64_t peak = 0;
    for (size_t i = lo; i < hi; i++)
      if (tl->step[i]->peak_in_use_bytes > peak) peak = tl->step[i]->peak_in_use_bytes;
    char label[48], bar[CHART_WIDTH + 1];
    if (hi - lo == 1) snprintf(label, sizeof label, "step %" PRIu64, tl->step[lo]->step);
    else snprintf(label, sizeof label, "steps %" PRIu64 "-%" PRIu64, tl->step[lo]->step, tl->step[hi - 1]->step);
    size_t len = (size_t)((double)peak / (double)top * CHART_WIDTH + 0.5);
    if (len > CHART_WIDTH) len = CHART_WIDTH;
    for (size_t c = 0; c < CHART_WIDTH; c++) bar[c] = c < len ? '#' : ' ';
    if (tl->planned_peak_bytes && bar[plan_col] == ' ') bar[plan_col] = '|';
    bar[CHART_WIDTH] = '\0';
    printf("  %-20s %s %s\n", label, bar, fsize(peak));
  }
}

static void memory_human(cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  const Gpushare__V1__MemoryTimeline *tl = r->memory->timeline;
  if (!tl) return;
  if (!tl->n_step && !tl->n_at_peak && !tl->peak_bytes) {
    printf("planned peak:  %s\n", fsize(tl->planned_peak_bytes));
    printf("(the measured timeline is there once the job has ended)\n");
    return;
  }
  printf("measured peak: %s\n", fsize(tl->peak_bytes));
  if (tl->planned_peak_bytes)
    printf("planned peak:  %s (measured is %.1f%% of planned)\n", fsize(tl->planned_peak_bytes),
           100.0 * (double)tl->peak_bytes / (double)tl->planned_peak_bytes);
  if (tl->n_step) memory_chart(tl);
  if (tl->n_at_peak) {
    printf("\nat the peak, by layer and role:\n");
    table t = {0};
    table_header(&t, 0x7f8u, (const char *const[]){"LAYER", "KIND", "OUTPUT", "WEIGHTS", "MASTER", "GRADIENTS",
                                                  "OPTIMIZER", "ACTIVATIONS", "WORKSPACE", "BATCH", "TOTAL", NULL});
    uint64_t sum[8] = {0};
    for (size_t i = 0; i < tl->n_at_peak; i++) {
      const Gpushare__V1__PlanRow *pr = tl->at_peak[i];
      uint64_t v[7] = {pr->weights_bytes, pr->master_bytes, pr->gradient_bytes, pr->optimizer_bytes,
                       pr->activation_bytes, pr->workspace_bytes, pr->batch_bytes};
      uint64_t row = 0;
      table_cell(&t, "%s", pr->layer ? pr->layer : "");
      table_cell(&t, "%s", pr->kind && *pr->kind ? pr->kind : "-");
      table_cell(&t, "%s", pr->output_shape && *pr->output_shape ? pr->output_shape : "-");
      for (int k = 0; k < 7; k++) {
        table_cell(&t, "%s", fsize(v[k]));
        sum[k] += v[k];
        row += v[k];
      }
      sum[7] += row;
      table_cell(&t, "%s", fsize(row));
    }
    table_cell(&t, "total");
    table_cell(&t, "%s", "");
    table_cell(&t, "%s", "");
    for (int k = 0; k < 8; k++) table_cell(&t, "%s", fsize(sum[k]));
    table_print(&t);
  }
}

static int cmd_memory(cli *x, parsed *p) {
  REQ(req, memory, MEMORY, Gpushare__V1__MemoryRequest, GPUSHARE__V1__MEMORY_REQUEST__INIT);
  if (parse_job_id(x, p->pos[0], &memory_msg.id)) return EXIT_USAGE;
  memory_msg.has_id = 1;
  return simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_MEMORY, memory_human);
}

static void metrics_human(cli *x, const Gpushare__V1__Response *r) {
  (void)x;
  if (r->metrics->text) fputs(r->metrics->text, stdout);
}

static int cmd_metrics(cli *x, parsed *p) {
  (void)p;
  REQ(req, metrics, METRICS, Gpushare__V1__MetricsRequest, GPUSHARE__V1__METRICS_REQUEST__INIT);
  return simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_METRICS, metrics_human);
}

static void version_human(cli *x, const Gpushare__V1__Response *r) {
  const Gpushare__V1__VersionResponse *v = r->version;
  printf("gpuctl:    %s\n", GS_VERSION);
  printf("gpushared: %s at %s\n", v->version ? v->version : "?", gs_client_socket_path(x->c));
  printf("you:       uid %" PRIu32 "%s, tenant %s\n", v->uid, v->admin ? " (admin)" : "",
         v->tenant && *v->tenant ? v->tenant : "(none)");
}

static int cmd_version(cli *x, parsed *p) {
  (void)p;
  REQ(req, version, VERSION, Gpushare__V1__VersionRequest, GPUSHARE__V1__VERSION_REQUEST__INIT);
  return simple(x, &req, GPUSHARE__V1__RESPONSE__RESULT_VERSION, version_human);
}

/* --------------------------------------------------------- command table --- */

static const flagdef no_flags[] = {{0}};

static const flagdef vdev_create_flags[] = {
    {"--device", NULL, "D", 0, 0, "physical device: cpu, gpu0, ... (default cpu)"},
    {"--memory", NULL, "SIZE", 0, 1, "memory limit, e.g. 4GiB, 512MiB"},
    {"--compute", NULL, "PCT", 0, 0, "compute share in percent of the device, 1..100"},
    {"--policy", NULL, "preallocate|growth", 0, 0, "reserve the whole limit now (the default) or on demand"},
    {"--tenant", NULL, "T", 0, 1, "the tenant the vdev belongs to"},
    {0}};

static const flagdef tenant_create_flags[] = {
    {"--uid", NULL, "U", 1, 0, "a member user id (repeatable)"},
    {"--gid", NULL, "G", 1, 0, "a member group id, supplementary groups included (repeatable)"},
    {"--memory", NULL, "SIZE", 0, 0, "quota: total vdev memory (0 = unlimited)"},
    {"--compute", NULL, "N", 0, 0, "quota: total compute share over its vdevs (0 = unlimited)"},
    {"--max-running", NULL, "N", 0, 0, "quota: jobs running at once (0 = unlimited)"},
    {"--max-queued", NULL, "N", 0, 0, "quota: jobs waiting at once (0 = unlimited)"},
    {0}};

static const flagdef quota_set_flags[] = {
    {"--memory", NULL, "SIZE", 0, 0, "total vdev memory (0 = unlimited)"},
    {"--compute", NULL, "N", 0, 0, "total compute share over its vdevs (0 = unlimited)"},
    {"--max-running", NULL, "N", 0, 0, "jobs running at once (0 = unlimited)"},
    {"--max-queued", NULL, "N", 0, 0, "jobs waiting at once (0 = unlimited)"},
    {0}};

static const flagdef plan_flags[] = {{"--vdev", NULL, "V", 0, 0, "plan against this vdev's memory limit"}, {0}};
static const flagdef submit_flags[] = {{"--watch", NULL, NULL, 0, 0, "follow the job until it ends (as gpuctl watch)"}, {0}};
static const flagdef job_encode_flags[] = {
    {"--output", "-o", "JOB.pb", 0, 0, "where to write (default: the input's name with .pb)"}, {0}};
static const flagdef list_flags[] = {{"--all", NULL, NULL, 0, 0, "include finished jobs"}, {0}};
static const flagdef fetch_flags[] = {
    {"--output", "-o", "FILE", 0, 1, "where to write (\"-\" for stdout)"},
    {"--checkpoint", NULL, NULL, 0, 0, "the last checkpoint instead of the trained weights"},
    {0}};

static const command commands[] = {
    {"devices", "", 0, 0, "list physical devices, their memory and what is allocated", no_flags, cmd_devices, NULL},
    {"vdev create", "NAME", 1, 1, "create a virtual device (admin)", vdev_create_flags, cmd_vdev_create, NULL},
    {"vdev list", "", 0, 0, "list virtual devices", no_flags, cmd_vdev_list, NULL},
    {"vdev delete", "NAME", 1, 1, "delete a virtual device (admin)", no_flags, cmd_vdev_delete, NULL},
    {"tenant create", "NAME", 1, 1, "create a tenant with members and a quota (admin)", tenant_create_flags,
     cmd_tenant_create, NULL},
    {"tenant list", "", 0, 0, "list tenants, their quotas and usage", no_flags, cmd_tenant_list, NULL},
    {"tenant delete", "NAME", 1, 1, "delete a tenant (admin)", no_flags, cmd_tenant_delete, NULL},
    {"quota set", "TENANT", 1, 1, "change a tenant's quota; only the flags given change (admin)", quota_set_flags,
     cmd_quota_set, NULL},
    {"quota show", "TENANT", 1, 1, "show a tenant's quota and usage", no_flags, cmd_quota_show, NULL},
    {"dataset add", "NAME FILE...", 2, -1, "upload files to the dataset store", no_flags, cmd_dataset_add,
     "One file becomes dataset NAME; several files become one dataset each, named\n"
     "NAME.BASENAME (e.g. fmnist.train-images-idx3-ubyte.gz). Files go up in 1 MiB\n"
     "chunks with their sha256, which the daemon checks before it commits them.\n"},
    {"dataset list", "", 0, 0, "list datasets you can use", no_flags, cmd_dataset_list, NULL},
    {"dataset rm", "NAME", 1, 1, "remove a dataset", no_flags, cmd_dataset_rm, NULL},
    {"job encode", "JOB.txtpb", 1, 1, "turn a job written as text protobuf into the binary JOB.pb", job_encode_flags,
     cmd_job_encode,
     "JOB.txtpb is a gpushare.v1.JobSpec in protobuf text format (see docs/jobs.md).\n"
     "protoc parses it against gpushare.proto, found at $GPUSHARE_PROTO,\n"
     "BIN/../share/gpushare/gpushare.proto, BIN/../../proto/gpushare.proto (a build\n"
     "tree) or /usr/share/gpushare/gpushare.proto; the result is checked by decoding\n"
     "it again. A spec that does not parse is reported with its line and column and\n"
     "nothing is written. Needs protoc (Debian: apt-get install protobuf-compiler).\n"},
    {"job show", "JOB.pb", 1, 1, "print a binary job spec as text protobuf (--json: as JSON)", no_flags,
     cmd_job_show, "The text form needs protoc, as job encode does; --json needs nothing else.\n"},
    {"plan", "JOB.pb", 1, 1, "predict a job's peak memory, layer by layer", plan_flags, cmd_plan,
     "JOB.pb is a binary gpushare.v1.JobSpec (gpuctl job encode JOB.txtpb).\n"
     "Local idx paths are hashed and sent as sha256: references; nothing is uploaded.\n"},
    {"submit", "JOB.pb", 1, 1, "submit a job (--watch: and follow it, as gpuctl watch)", submit_flags, cmd_submit,
     "JOB.pb is a binary gpushare.v1.JobSpec (gpuctl job encode JOB.txtpb).\n"
     "idx images/labels given as local paths (relative to the current directory)\n"
     "are uploaded unless your store already holds the same sha256, and the job\n"
     "refers to them as sha256:HEX; a bare name that is no file here names one of\n"
     "your datasets (gpuctl dataset add NAME FILE). A job that does not fit is\n"
     "refused with its plan.\n"},
    {"status", "ID", 1, 1, "show a job: state, progress, epochs, an out-of-memory report", no_flags, cmd_status, NULL},
    {"list", "", 0, 0, "list your jobs (queued and running, or --all)", list_flags, cmd_list, NULL},
    {"watch", "ID", 1, 1, "follow a job until it ends; exit 0 if it succeeded, 1 otherwise", no_flags, cmd_watch,
     "On a terminal the progress is one live line (epoch, step, loss, the last\n"
     "epoch's test accuracy, samples/s, memory in use / limit, fp16 loss scale);\n"
     "otherwise a line per epoch and at most one progress line every 5 seconds.\n"
     "The last line says how the job ended; on failure the reason and any\n"
     "out-of-memory report go to stderr. With --json: one gpushare.v1.WatchResponse\n"
     "per line.\n"},
    {"cancel", "ID", 1, 1, "cancel a job (it stops at its next step)", no_flags, cmd_cancel, NULL},
    {"logs", "ID", 1, 1, "print a job's events", no_flags, cmd_logs, NULL},
    {"fetch", "ID", 1, 1, "download a job's trained weights (safetensors) or checkpoint", fetch_flags, cmd_fetch, NULL},
    {"memory", "ID", 1, 1, "a job's measured memory: a chart of the peak by step, the peak by layer and role",
     no_flags, cmd_memory, NULL},
    {"metrics", "", 0, 0, "the daemon's metrics in Prometheus text format", no_flags, cmd_metrics, NULL},
    {"version", "", 0, 0, "versions, and who the daemon thinks you are", no_flags, cmd_version, NULL},
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

static const char *const groups[] = {"vdev", "tenant", "quota", "dataset", "job", NULL};

static void print_main_usage(FILE *f) {
  fprintf(f,
          "usage: gpuctl [--socket P] [--json] COMMAND [ARGS...]\n"
          "\n"
          "Talk to gpushared, the multi-tenant GPU sharing daemon.\n"
          "\n"
          "global options:\n"
          "  --socket P   the daemon's socket (default $GPUSHARE_SOCKET, else %s)\n"
          "  --json       print results as JSON (gpushare.v1 field names)\n"
          "  --help       this text; 'gpuctl COMMAND --help' for one command\n"
          "\n"
          "commands:\n",
          GS_CLIENT_DEFAULT_SOCKET);
  for (size_t i = 0; i < NCOMMANDS; i++) {
    char head[64];
    snprintf(head, sizeof head, "%s%s%s", commands[i].name, commands[i].args[0] ? " " : "", commands[i].args);
    fprintf(f, "  %-26s %s\n", head, commands[i].summary);
  }
  fprintf(f,
          "\n"
          "Sizes read as 4GiB, 512MiB, 64k (powers of 1024) or 1.5GB (powers of 1000).\n"
          "Exit status: 0 ok, 1 refused or failed, 2 usage error.\n");
}

static void print_command_usage(FILE *f, const command *c) {
  fprintf(f, "usage: gpuctl [--socket P] [--json] %s", c->name);
  if (c->args[0]) fprintf(f, " %s", c->args);
  for (const flagdef *fl = c->flags; fl->name; fl++) {
    fprintf(f, " %s%s%s%s%s%s", fl->required ? "" : "[", fl->alias ? fl->alias : fl->name, fl->metavar ? " " : "",
            fl->metavar ? fl->metavar : "", fl->required ? "" : "]", fl->repeat ? "..." : "");
  }
  fprintf(f, "\n\n%s.\n", c->summary);
  if (c->flags->name) {
    fprintf(f, "\noptions:\n");
    for (const flagdef *fl = c->flags; fl->name; fl++) {
      char head[64];
      snprintf(head, sizeof head, "%s%s%s%s%s", fl->alias ? fl->alias : "", fl->alias ? ", " : "", fl->name,
               fl->metavar ? " " : "", fl->metavar ? fl->metavar : "");
      fprintf(f, "  %-22s %s%s\n", head, fl->help, fl->required ? " (required)" : "");
    }
  }
  if (c->details) fprintf(f, "\n%s", c->details);
}

static void print_group_usage(FILE *f, const char *group) {
  fprintf(f, "usage: gpuctl [--socket P] [--json] %s SUBCOMMAND ...\n\nsubcommands:\n", group);
  size_t gl = strlen(group);
  for (size_t i = 0; i < NCOMMANDS; i++) {
    if (strncmp(commands[i].name, group, gl) || commands[i].name[gl] != ' ') continue;
    char head[64];
    snprintf(head, sizeof head, "%s%s%s", commands[i].name, commands[i].args[0] ? " " : "", commands[i].args);
    fprintf(f, "  %-26s %s\n", head, commands[i].summary);
  }
}

static int is_group(const char *w) {
  for (int i = 0; groups[i]; i++)
    if (!strcmp(groups[i], w)) return 1;
  return 0;
}

static const command *find_command(const char *w1, const char *w2, int *nwords) {
  char two[128];
  if (w2) {
    snprintf(two, sizeof two, "%s %s", w1, w2);
    for (size_t i = 0; i < NCOMMANDS; i++)
      if (!strcmp(commands[i].name, two)) {
        *nwords = 2;
        return &commands[i];
      }
  }
  for (size_t i = 0; i < NCOMMANDS; i++)
    if (!strcmp(commands[i].name, w1)) {
      *nwords = 1;
      return &commands[i];
    }
  return NULL;
}

/* Parse the words after the command name against its flag table. */
static int parse_command_args(cli *x, const command *c, int argc, char **argv, parsed *p) {
  int nflags = 0;
  while (c->flags[nflags].name) nflags++;
  int only_pos = 0;
  for (int i = 0; i < argc; i++) {
    const char *a = argv[i];
    if (!only_pos && !strcmp(a, "--")) {
      only_pos = 1;
      continue;
    }
    if (!only_pos && a[0] == '-' && a[1] != '\0') {
      const char *eq = strchr(a, '=');
      size_t nlen = eq ? (size_t)(eq - a) : strlen(a);
      int k = 0;
      for (; k < nflags; k++) {
        const flagdef *fl = &c->flags[k];
        if ((strlen(fl->name) == nlen && !strncmp(fl->name, a, nlen)) ||
            (fl->alias && strlen(fl->alias) == nlen && !strncmp(fl->alias, a, nlen)))
          break;
      }
      if (k == nflags) return usage_error(x, "unknown flag %.*s", (int)nlen, a);
      const flagdef *fl = &c->flags[k];
      const char *v = "";
      if (fl->metavar) {
        if (eq) v = eq + 1;
        else if (i + 1 < argc) v = argv[++i];
        else return usage_error(x, "%s needs a value (%s)", fl->name, fl->metavar);
      } else if (eq) {
        return usage_error(x, "%s takes no value (got \"%s\")", fl->name, eq + 1);
      }
      if (p->nval[k] && !fl->repeat) return usage_error(x, "%s is given more than once", fl->name);
      if (p->nval[k] == MAX_ARGS) return usage_error(x, "%s is given more than %d times", fl->name, MAX_ARGS);
      p->val[k][p->nval[k]++] = v;
      continue;
    }
    if (p->npos == MAX_ARGS) return usage_error(x, "more than %d arguments", MAX_ARGS);
    p->pos[p->npos++] = a;
  }
  if (p->npos < c->min_pos)
    return usage_error(x, "missing %s", c->args[0] ? c->args : "argument");
  if (c->max_pos >= 0 && p->npos > c->max_pos)
    return usage_error(x, "unexpected argument \"%s\"%s%s", p->pos[c->max_pos],
                       c->args[0] ? "; expected " : "", c->args);
  for (int k = 0; k < nflags; k++)
    if (c->flags[k].required && !p->nval[k])
      return usage_error(x, "%s %s is required", c->flags[k].name, c->flags[k].metavar ? c->flags[k].metavar : "");
  for (int i = 0; i < p->npos; i++)
    if (!p->pos[i][0]) return usage_error(x, "argument %d is empty", i + 1);
  return 0;
}

int main(int argc, char **argv) {
  cli x = {0};
  int help = 0;
  /* Global options may appear anywhere before "--"; the rest is the command. */
  char **rest = calloc((size_t)argc + 1, sizeof *rest);
  if (!rest) return fail("out of memory");
  int nrest = 0, rc;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--")) {
      while (i < argc) rest[nrest++] = argv[i++];
      break;
    }
    if (!strcmp(a, "--json")) x.json = 1;
    else if (!strcmp(a, "--help") || !strcmp(a, "-h")) help = 1;
    else if (!strcmp(a, "--socket") || !strncmp(a, "--socket=", 9)) {
      const char *v = a[8] == '=' ? a + 9 : (i + 1 < argc ? argv[++i] : NULL);
      if (!v) {
        fprintf(stderr, "gpuctl: --socket needs a value (P, the daemon's socket path)\nTry 'gpuctl --help'.\n");
        rc = EXIT_USAGE;
        goto out;
      }
      if (!*v) {
        fprintf(stderr, "gpuctl: --socket: the path is empty\nTry 'gpuctl --help'.\n");
        rc = EXIT_USAGE;
        goto out;
      }
      x.socket = v;
    } else {
      rest[nrest++] = argv[i];
    }
  }
  int cstart = 0;
  if (nrest > 0 && !strcmp(rest[0], "help")) {
    help = 1;
    cstart = 1;
  }
  if (cstart >= nrest) {
    print_main_usage(help ? stdout : stderr);
    rc = help ? EXIT_OK : EXIT_USAGE;
    goto out;
  }
  const char *w1 = rest[cstart];
  if (w1[0] == '-') {
    fprintf(stderr, "gpuctl: unknown option %s\nTry 'gpuctl --help'.\n", w1);
    rc = EXIT_USAGE;
    goto out;
  }
  int nwords = 0;
  const command *c = find_command(w1, cstart + 1 < nrest ? rest[cstart + 1] : NULL, &nwords);
  if (!c) {
    if (is_group(w1)) {
      if (help) {
        print_group_usage(stdout, w1);
        rc = EXIT_OK;
      } else {
        if (cstart + 1 < nrest) fprintf(stderr, "gpuctl: %s: unknown subcommand \"%s\"\n", w1, rest[cstart + 1]);
        else fprintf(stderr, "gpuctl: %s: missing subcommand\n", w1);
        print_group_usage(stderr, w1);
        rc = EXIT_USAGE;
      }
    } else {
      fprintf(stderr, "gpuctl: unknown command \"%s\"\nTry 'gpuctl --help'.\n", w1);
      rc = EXIT_USAGE;
    }
    goto out;
  }
  x.cmd = c;
  if (help) {
    print_command_usage(stdout, c);
    rc = EXIT_OK;
    goto out;
  }
  parsed *p = calloc(1, sizeof *p);
  if (!p) {
    rc = fail("out of memory");
    goto out;
  }
  rc = parse_command_args(&x, c, nrest - cstart - nwords, rest + cstart + nwords, p);
  if (!rc) rc = c->run(&x, p);
  free(p);
  gs_client_close(x.c);
out:
  free(rest);
  return rc;
}
