/*
 * pbjson.c: gpuctl's JSON output, generated from protobuf-c descriptors.
 *
 * With --json a command prints its call's result message field by field
 * from the message's descriptor, with the .proto's field names, so the JSON
 * follows the protocol without a hand-written mapping per call: 64-bit
 * integers are plain JSON numbers, enums their names, bytes base64, unset
 * optional fields left out, repeated fields always present ([] when empty).
 * Floats are written with 7 significant digits, doubles with 17; NaN and
 * the infinities, which JSON lacks, as strings.
 *
 * This file owns the streaming writer (pbjson: commas and nesting), the
 * escaping of strings, and the walk over a message's fields. It knows
 * nothing of gpushare: any protobuf-c message prints.
 */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "client/pbjson.h"

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
static void json_member(pbjson *j, const char *key) {
  if (j->depth > 0 && j->count[j->depth]++ > 0) fputc(',', j->f);
  if (key) {
    json_string(j->f, key);
    fputc(':', j->f);
  }
}

void pbjson_open(pbjson *j, const char *key, char brace) {
  json_member(j, key);
  fputc(brace, j->f);
  if (j->depth < 63) j->depth++;
  j->count[j->depth] = 0;
}

void pbjson_close(pbjson *j, char brace) {
  fputc(brace, j->f);
  if (j->depth > 0) j->depth--;
}

void pbjson_str(pbjson *j, const char *key, const char *v) {
  json_member(j, key);
  json_string(j->f, v ? v : "");
}

void pbjson_u64(pbjson *j, const char *key, uint64_t v) {
  json_member(j, key);
  fprintf(j->f, "%" PRIu64, v);
}

static void json_i64(pbjson *j, const char *key, int64_t v) {
  json_member(j, key);
  fprintf(j->f, "%" PRId64, v);
}

static void json_num(pbjson *j, const char *key, double v, int digits) {
  json_member(j, key);
  if (isfinite(v)) fprintf(j->f, "%.*g", digits, v);
  else json_string(j->f, isnan(v) ? "NaN" : v > 0 ? "Infinity" : "-Infinity");
}

void pbjson_bool(pbjson *j, const char *key, int v) {
  json_member(j, key);
  fputs(v ? "true" : "false", j->f);
}

static void json_base64(pbjson *j, const char *key, const uint8_t *p, size_t n) {
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

/* One value of field f stored at p. */
static void json_value(pbjson *j, const char *key, const ProtobufCFieldDescriptor *f, const void *p) {
  switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32: json_i64(j, key, *(const int32_t *)p); break;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32: pbjson_u64(j, key, *(const uint32_t *)p); break;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64: json_i64(j, key, *(const int64_t *)p); break;
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64: pbjson_u64(j, key, *(const uint64_t *)p); break;
    case PROTOBUF_C_TYPE_FLOAT: json_num(j, key, *(const float *)p, 7); break;
    case PROTOBUF_C_TYPE_DOUBLE: json_num(j, key, *(const double *)p, 17); break;
    case PROTOBUF_C_TYPE_BOOL: pbjson_bool(j, key, *(const protobuf_c_boolean *)p); break;
    case PROTOBUF_C_TYPE_ENUM: {
      int v = *(const int *)p;
      const ProtobufCEnumValue *ev =
          protobuf_c_enum_descriptor_get_value((const ProtobufCEnumDescriptor *)f->descriptor, v);
      if (ev) pbjson_str(j, key, ev->name);
      else json_i64(j, key, v);
      break;
    }
    case PROTOBUF_C_TYPE_STRING: pbjson_str(j, key, *(char *const *)p); break;
    case PROTOBUF_C_TYPE_BYTES: {
      const ProtobufCBinaryData *b = p;
      json_base64(j, key, b->data, b->len);
      break;
    }
    case PROTOBUF_C_TYPE_MESSAGE: pbjson_message(j, key, *(ProtobufCMessage *const *)p); break;
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

void pbjson_message(pbjson *j, const char *key, const ProtobufCMessage *m) {
  if (!m) {
    json_member(j, key);
    fputs("null", j->f);
    return;
  }
  const ProtobufCMessageDescriptor *d = m->descriptor;
  pbjson_open(j, key, '{');
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    const char *base = (const char *)m;
    const void *p = base + f->offset;
    if (f->label == PROTOBUF_C_LABEL_REPEATED) {
      /* always written, [] when empty, so `jq '.job[]'` works on no jobs */
      size_t n = *(const size_t *)(base + f->quantifier_offset);
      const char *arr = *(char *const *)p;
      pbjson_open(j, f->name, '[');
      for (size_t k = 0; k < n; k++) json_value(j, NULL, f, arr + k * field_size(f));
      pbjson_close(j, ']');
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
  pbjson_close(j, '}');
}

/* Print one message as a JSON line on stdout. */
void pbjson_print(const ProtobufCMessage *m) {
  pbjson j = {.f = stdout};
  pbjson_message(&j, NULL, m);
  fputc('\n', stdout);
  fflush(stdout);
}
