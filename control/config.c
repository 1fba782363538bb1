/*
 * config.c: reading gpushared.conf into a gs_config.
 *
 * The file is a list of `key = value` lines. A line whose first non-blank
 * character is '#' is a comment, blank lines are ignored, and there are no
 * sections, quotes, escapes or inline comments: a '#' after a value is part
 * of the value, and is then refused by that key's check, so a comment in the
 * wrong place is an error that names the line rather than a silent change.
 *
 * Every key is described once in gs_config__keys (name, kind, where the
 * field lives, its bounds); parsing, the "allowed keys" list in errors and
 * the restart check all read that one table, so a new setting is one line
 * there plus its field in config.h. Values of kind SIZE go through
 * gs_size_parse ("16MiB", "1GiB"), MODE is octal with a leading 0 ("0660"),
 * UINT is decimal, STRING has a length limit and, for group names and
 * log levels, a character or choice check.
 *
 * The whole file is parsed into a copy that replaces *c only when every line
 * is valid, so a bad SIGHUP reload leaves the running configuration intact.
 * A key given twice is an error that names both lines: with no sections a
 * repeat is always a mistake. Two keys whose values depend on each other
 * are checked together once the whole file is read (gs_config__pairs), so
 * the order of the lines does not matter.
 */
#include "control/config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/size.h"

#define GS_CONFIG_MIB ((uint64_t)1 << 20)
#define GS_CONFIG_GIB ((uint64_t)1 << 30)
#define GS_CONFIG_FRAME_MAX (16 * GS_CONFIG_MIB) /* the protocol's hard limit */
#define GS_CONFIG_FRAME_MIN (2 * GS_CONFIG_MIB) /* a 1 MiB upload chunk and its envelope */
#define GS_CONFIG_SPEC_MIN ((uint64_t)1 << 10)  /* the smallest useful JobSpec is ~100 bytes */

enum gs_config__kind {
  GS_CONFIG__PATH,  /* absolute path, fits the field */
  GS_CONFIG__GROUP, /* group name: [A-Za-z0-9_.-], not starting with '-' */
  GS_CONFIG__LEVEL, /* one of error|warn|info|debug */
  GS_CONFIG__MODE,  /* octal permission bits, 0000..0777 */
  GS_CONFIG__UINT,  /* decimal, min..max */
  GS_CONFIG__SIZE,  /* byte size through gs_size_parse, min..max */
  GS_CONFIG__BOOL,  /* yes|no|true|false|on|off|1|0 into an unsigned 0/1 */
};

struct gs_config__key {
  const char *name;  /* key in the file, the field's name in gs_config */
  int kind;          /* enum gs_config__kind */
  size_t off;        /* offsetof the field */
  size_t len;        /* sizeof the field (strings: capacity with NUL) */
  uint64_t min, max; /* bounds for UINT and SIZE */
  int live;          /* 1: a SIGHUP reload applies it; 0: needs a restart */
};

#define GS_K(n, k, lo, hi, live) \
  {#n, k, offsetof(gs_config, n), sizeof(((gs_config *)0)->n), lo, hi, live}

static const struct gs_config__key gs_config__keys[] = {
    GS_K(socket_path, GS_CONFIG__PATH, 0, 0, 0),
    GS_K(state_dir, GS_CONFIG__PATH, 0, 0, 0),
    GS_K(socket_group, GS_CONFIG__GROUP, 0, 0, 0),
    GS_K(socket_mode, GS_CONFIG__MODE, 0, 0777, 0),
    GS_K(admin_group, GS_CONFIG__GROUP, 0, 0, 1),
    GS_K(cpu_memory, GS_CONFIG__SIZE, 0, UINT64_MAX, 0),
    GS_K(gpu_reserve, GS_CONFIG__SIZE, 0, UINT64_MAX, 0),
    GS_K(cpu_threads, GS_CONFIG__UINT, 0, 65536, 0),
    GS_K(memory_oversubscribe, GS_CONFIG__BOOL, 0, 1, 0),
    GS_K(max_connections, GS_CONFIG__UINT, 1, 1000000, 1),
    GS_K(max_connections_per_uid, GS_CONFIG__UINT, 1, 1000000, 1),
    GS_K(admin_reserved_connections, GS_CONFIG__UINT, 0, 999999, 1),
    GS_K(max_inflight, GS_CONFIG__UINT, 1, 65536, 1),
    GS_K(idle_timeout_s, GS_CONFIG__UINT, 0, 31536000, 1),
    GS_K(idle_timeout_norole_s, GS_CONFIG__UINT, 0, 31536000, 1),
    GS_K(frame_timeout_s, GS_CONFIG__UINT, 1, 3600, 1),
    GS_K(max_frame, GS_CONFIG__SIZE, GS_CONFIG_FRAME_MIN, GS_CONFIG_FRAME_MAX, 1),
    GS_K(max_pending_frame_bytes, GS_CONFIG__SIZE, GS_CONFIG_FRAME_MIN, UINT64_MAX, 1),
    GS_K(max_upload, GS_CONFIG__SIZE, 1, UINT64_MAX, 1),
    GS_K(max_tenant_datasets, GS_CONFIG__SIZE, 1, UINT64_MAX, 1),
    GS_K(max_job_spec, GS_CONFIG__SIZE, GS_CONFIG_SPEC_MIN, GS_CONFIG_FRAME_MAX, 1),
    GS_K(preempt_min_run_s, GS_CONFIG__UINT, 0, 31536000, 1),
    GS_K(preempt_interval_s, GS_CONFIG__UINT, 0, 31536000, 1),
    GS_K(oom_retries, GS_CONFIG__UINT, 0, 100, 1),
    GS_K(log_level, GS_CONFIG__LEVEL, 0, 0, 1),
};
#define GS_CONFIG__NKEYS (sizeof gs_config__keys / sizeof gs_config__keys[0])

static const char *const gs_config__levels[] = {"error", "warn", "info", "debug"};

void gs_config_defaults(gs_config *c) {
  memset(c, 0, sizeof *c);
  const char *env = getenv("GPUSHARE_SOCKET");
  if (env != NULL && env[0] != '\0' && strlen(env) < sizeof c->socket_path)
    snprintf(c->socket_path, sizeof c->socket_path, "%s", env);
  else
    snprintf(c->socket_path, sizeof c->socket_path, "%s", "/run/gpushared.sock");
  snprintf(c->state_dir, sizeof c->state_dir, "%s", "/var/lib/gpushared");
  snprintf(c->socket_group, sizeof c->socket_group, "%s", "gpushare");
  c->socket_mode = 0660;
  snprintf(c->admin_group, sizeof c->admin_group, "%s", "gpushare-admin");
  c->cpu_memory = 0;
  c->gpu_reserve = GS_CONFIG_GIB;
  c->cpu_threads = 0;
  c->memory_oversubscribe = 0;
  c->max_connections = 256;
  c->max_connections_per_uid = 32;
  c->admin_reserved_connections = 8;
  c->max_inflight = 64;
  c->idle_timeout_s = 600;
  c->idle_timeout_norole_s = 10;
  c->frame_timeout_s = 10;
  c->max_frame = GS_CONFIG_FRAME_MAX;
  c->max_pending_frame_bytes = 4 * GS_CONFIG_FRAME_MAX;
  c->max_upload = GS_CONFIG_GIB;
  c->max_tenant_datasets = 16 * GS_CONFIG_GIB;
  c->max_job_spec = GS_CONFIG_MIB;
  c->preempt_min_run_s = 60;
  c->preempt_interval_s = 300;
  c->oom_retries = 3;
  snprintf(c->log_level, sizeof c->log_level, "%s", "info");
}

/* "FILE:LINE key" for e->field; a long path keeps its tail, since the file
   name and the key are what locate the error. */
static void gs_config__where(char *buf, size_t cap, const char *path, unsigned line,
                             const char *key) {
  char tail[32];
  snprintf(tail, sizeof tail, ":%u%s", line, key[0] ? " " : "");
  size_t klen = strlen(key), tlen = strlen(tail), plen = strlen(path);
  size_t room = cap > 1 + tlen + klen ? cap - 1 - tlen - klen : 0;
  const char *head = "";
  if (plen > room && room > 3) {
    head = "...";
    path += plen - (room - 3);
  }
  /* Assemble by hand: the parts were sized above, so nothing is cut but the
   * path's head, and gcc's truncation analysis has nothing to guess. */
  size_t o = 0;
  const char *parts[4] = {head, path, tail, key};
  for (int i = 0; i < 4; i++)
    for (const char *p = parts[i]; *p && o + 1 < cap; p++) buf[o++] = *p;
  buf[o] = '\0';
}

static void gs_config__key_list(char *buf, size_t cap) {
  size_t n = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < GS_CONFIG__NKEYS && n + 1 < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? ", " : "", gs_config__keys[i].name);
}

/* Parse one value into the field of c that k describes; on refusal fill e
   (msg only, the caller sets the location) and return -1. */
static int gs_config__set(gs_config *c, const struct gs_config__key *k, const char *v,
                          gs_err *e) {
  char *field = (char *)c + k->off;
  size_t vlen = strlen(v);
  switch (k->kind) {
  case GS_CONFIG__PATH:
  case GS_CONFIG__GROUP:
  case GS_CONFIG__LEVEL:
    if (vlen >= k->len)
      return gs_err_set(e, GS_INVALID_ARGUMENT, "",
                        "value \"%.40s...\" is %zu bytes long; %s allows at most %zu",
                        v, vlen, k->name, k->len - 1);
    if (k->kind == GS_CONFIG__PATH && v[0] != '/')
      return gs_err_set(e, GS_INVALID_ARGUMENT, "",
                        "value \"%s\" is not an absolute path; %s must start with '/'", v,
                        k->name);
    if (k->kind == GS_CONFIG__GROUP) {
      for (const char *p = v; *p; p++)
        if (!(isalnum((unsigned char)*p) || *p == '_' || *p == '.' || *p == '-') ||
            (p == v && *p == '-'))
          return gs_err_set(e, GS_INVALID_ARGUMENT, "",
                            "value \"%s\" is not a group name; allowed: letters, digits, "
                            "'_', '.', '-' (not first)",
                            v);
    }
    if (k->kind == GS_CONFIG__LEVEL) {
      size_t i = 0;
      while (i < 4 && strcmp(v, gs_config__levels[i]) != 0) i++;
      if (i == 4)
        return gs_err_set(e, GS_INVALID_ARGUMENT, "",
                          "value \"%s\" is not a log level; allowed: error, warn, info, debug",
                          v);
    }
    memcpy(field, v, vlen + 1);
    return 0;
  case GS_CONFIG__MODE: {
    char *end = NULL;
    unsigned long m = 0;
    if (v[0] == '0') {
      errno = 0;
      m = strtoul(v, &end, 8);
    }
    if (v[0] != '0' || errno != 0 || end == NULL || *end != '\0' || m > k->max)
      return gs_err_set(e, GS_INVALID_ARGUMENT, "",
                        "value \"%s\" is not a file mode; allowed: octal with a leading 0, "
                        "0000 to 0777, e.g. 0660",
                        v);
    *(unsigned *)(void *)field = (unsigned)m;
    return 0;
  }
  case GS_CONFIG__UINT: {
    char *end = NULL;
    unsigned long long u = 0;
    int ok = isdigit((unsigned char)v[0]);
    if (ok) {
      errno = 0;
      u = strtoull(v, &end, 10);
      ok = errno == 0 && *end == '\0';
    }
    if (!ok || u < k->min || u > k->max)
      return gs_err_set(e, GS_INVALID_ARGUMENT, "",
                        "value \"%s\" is not allowed; %s takes a whole number from %" PRIu64
                        " to %" PRIu64,
                        v, k->name, k->min, k->max);
    *(unsigned *)(void *)field = (unsigned)u;
    return 0;
  }
  case GS_CONFIG__BOOL: {
    static const char *const yes[] = {"yes", "true", "on", "1"}, *const no[] = {"no", "false",
                                                                               "off", "0"};
    for (int i = 0; i < 4; i++) {
      if (!strcmp(v, yes[i]) || !strcmp(v, no[i])) {
        *(unsigned *)(void *)field = !strcmp(v, yes[i]);
        return 0;
      }
    }
    return gs_err_set(e, GS_INVALID_ARGUMENT, "",
                      "value \"%s\" is not a boolean; %s takes yes or no (also true/false, "
                      "on/off, 1/0)",
                      v, k->name);
  }
  case GS_CONFIG__SIZE: {
    uint64_t b = 0;
    gs_err se;
    gs_err_clear(&se);
    if (gs_size_parse(v, &b, &se) != 0)
      return gs_err_set(e, GS_INVALID_ARGUMENT, "", "%s: %s", k->name, se.msg);
    if (b < k->min || b > k->max) {
      char lo[32], hi[32];
      gs_size_format(k->min, lo, sizeof lo);
      if (k->max == UINT64_MAX)
        return gs_err_set(e, GS_INVALID_ARGUMENT, "",
                          "value \"%s\" is too small; %s must be at least %s", v, k->name, lo);
      gs_size_format(k->max, hi, sizeof hi);
      return gs_err_set(e, GS_INVALID_ARGUMENT, "",
                        "value \"%s\" is out of range; %s allows %s to %s", v, k->name, lo, hi);
    }
    memcpy(field, &b, sizeof b);
    return 0;
  }
  }
  return gs_err_set(e, GS_INTERNAL, "", "key %s has no parser", k->name);
}

static char *gs_config__trim(char *s) {
  while (*s == ' ' || *s == '\t') s++;
  size_t n = strlen(s);
  while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' ||
                   s[n - 1] == '\r'))
    s[--n] = '\0';
  return s;
}

static size_t gs_config__index(const char *name) {
  size_t i = 0;
  while (i < GS_CONFIG__NKEYS && strcmp(name, gs_config__keys[i].name) != 0) i++;
  return i;
}

/* Keys that bound each other, checked on the whole parsed file c. On
   refusal: -1, e's field the line of whichever of the two the file set
   (the later one when it set both; seen[] holds each key's line). */
static int gs_config__pairs(const gs_config *c, const unsigned *seen, const char *path,
                            gs_err *e) {
  const char *a, *b; /* the two keys: a is the one whose range depends on b */
  char msg[sizeof e->msg];
  if (c->admin_reserved_connections >= c->max_connections) {
    a = "admin_reserved_connections";
    b = "max_connections";
    snprintf(msg, sizeof msg,
             "admin_reserved_connections %u with max_connections %u leaves no connection for "
             "anyone but admins; allowed: admin_reserved_connections from 0 to "
             "max_connections - 1 (%u)",
             c->admin_reserved_connections, c->max_connections, c->max_connections - 1);
  } else if (c->max_pending_frame_bytes < c->max_frame) {
    char p[32], f[32];
    a = "max_pending_frame_bytes";
    b = "max_frame";
    snprintf(msg, sizeof msg,
             "max_pending_frame_bytes %s is less than max_frame %s, so a frame of the largest "
             "size could never be received; allowed: max_pending_frame_bytes from max_frame up",
             gs_size_format(c->max_pending_frame_bytes, p, sizeof p),
             gs_size_format(c->max_frame, f, sizeof f));
  } else {
    return 0;
  }
  unsigned la = seen[gs_config__index(a)], lb = seen[gs_config__index(b)];
  const char *key = la >= lb ? a : b;
  char where[sizeof e->field];
  gs_config__where(where, sizeof where, path, la >= lb ? la : lb, key);
  return gs_err_set(e, GS_INVALID_ARGUMENT, where, "%s", msg);
}

int gs_config_load(const char *path, gs_config *c, gs_err *e) {
  gs_config tmp = *c;
  unsigned seen[GS_CONFIG__NKEYS] = {0}; /* line each key was set on, 0: not yet */
  char where[sizeof e->field];
  char *line = NULL;
  size_t cap = 0;
  unsigned lineno = 0;
  int rc = -1;

  FILE *f = fopen(path, "re");
  if (f == NULL) {
    int err = errno;
    gs_err_set(e, err == ENOENT ? GS_NOT_FOUND : GS_FAILED_PRECONDITION, path,
               "cannot open the configuration file: %s", strerror(err));
    errno = err;
    return gs_err_rc(e);
  }
  for (;;) {
    errno = 0;
    ssize_t n = getline(&line, &cap, f);
    if (n < 0) {
      if (errno != 0 || ferror(f)) {
        gs_config__where(where, sizeof where, path, lineno + 1, "");
        gs_err_set(e, GS_FAILED_PRECONDITION, where, "cannot read the configuration file: %s",
                   strerror(errno ? errno : EIO));
        goto fail;
      }
      break;
    }
    lineno++;
    if ((size_t)n != strlen(line)) {
      gs_config__where(where, sizeof where, path, lineno, "");
      gs_err_set(e, GS_INVALID_ARGUMENT, where,
                 "the line contains a NUL byte; the configuration file must be text");
      goto fail;
    }
    char *s = gs_config__trim(line);
    if (s[0] == '\0' || s[0] == '#') continue;
    char *eq = strchr(s, '=');
    if (eq == NULL) {
      gs_config__where(where, sizeof where, path, lineno, "");
      gs_err_set(e, GS_INVALID_ARGUMENT, where,
                 "line \"%.200s\" has no '='; each line must read `key = value`", s);
      goto fail;
    }
    *eq = '\0';
    char *key = gs_config__trim(s);
    char *val = gs_config__trim(eq + 1);
    size_t i = gs_config__index(key);
    if (key[0] == '\0' || i == GS_CONFIG__NKEYS) {
      char keys[512];
      gs_config__key_list(keys, sizeof keys);
      gs_config__where(where, sizeof where, path, lineno, key[0] ? key : "");
      gs_err_set(e, GS_INVALID_ARGUMENT, where,
                 key[0] ? "unknown key \"%.64s\"; allowed keys: %s"
                        : "a line has no key before '='%.0s; allowed keys: %s",
                 key, keys);
      goto fail;
    }
    gs_config__where(where, sizeof where, path, lineno, key);
    if (seen[i] != 0) {
      gs_err_set(e, GS_INVALID_ARGUMENT, where,
                 "%s is set again (first on line %u); give each key once", key, seen[i]);
      goto fail;
    }
    if (val[0] == '\0') {
      gs_err_set(e, GS_INVALID_ARGUMENT, where,
                 "%s has an empty value; remove the line to keep the default", key);
      goto fail;
    }
    if (gs_config__set(&tmp, &gs_config__keys[i], val, e) != 0) {
      if (e) snprintf(e->field, sizeof e->field, "%s", where);
      goto fail;
    }
    seen[i] = lineno;
  }
  if (gs_config__pairs(&tmp, seen, path, e) != 0) goto fail;
  *c = tmp;
  rc = 0;
fail:
  free(line);
  fclose(f);
  return rc;
}

/* Append the value of key k in c to buf as text. */
static void gs_config__value(const gs_config *c, const struct gs_config__key *k, char *buf,
                             size_t cap) {
  const char *field = (const char *)c + k->off;
  switch (k->kind) {
  case GS_CONFIG__MODE:
    snprintf(buf, cap, "%04o", *(const unsigned *)(const void *)field);
    break;
  case GS_CONFIG__UINT:
    snprintf(buf, cap, "%u", *(const unsigned *)(const void *)field);
    break;
  case GS_CONFIG__BOOL:
    snprintf(buf, cap, "%s", *(const unsigned *)(const void *)field ? "yes" : "no");
    break;
  case GS_CONFIG__SIZE: {
    uint64_t b;
    memcpy(&b, field, sizeof b);
    snprintf(buf, cap, "%" PRIu64, b);
    break;
  }
  default:
    snprintf(buf, cap, "%s", field);
  }
}

char *gs_config_restart_needed(const gs_config *old, const gs_config *neu) {
  char *out = NULL;
  size_t len = 0;
  FILE *m = open_memstream(&out, &len);
  if (m == NULL) return NULL;
  int any = 0;
  for (size_t i = 0; i < GS_CONFIG__NKEYS; i++) {
    const struct gs_config__key *k = &gs_config__keys[i];
    if (k->live) continue;
    char a[4096 + 1], b[4096 + 1];
    gs_config__value(old, k, a, sizeof a);
    gs_config__value(neu, k, b, sizeof b);
    if (strcmp(a, b) == 0) continue;
    fprintf(m, "%s%s (%s -> %s)", any ? ", " : "", k->name, a, b);
    any = 1;
  }
  if (fclose(m) != 0 || !any) {
    free(out);
    return NULL;
  }
  return out;
}
