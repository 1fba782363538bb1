/*
 * cli.h: what cli.c lends gpuctl's commands: the usage
 * error and the local failure as gpuctl words them, strict parsing of the
 * values of arguments, and the connection to the daemon with one call made
 * and its answer printed.
 *
 * Exit statuses: a usage error is GPUCTL_EXIT_USAGE (2), anything refused or
 * failed GPUCTL_EXIT_FAIL (1); each function that reports one returns it.
 *
 * Errors go to stderr: as text ("gpuctl: ..."), or with --json as one JSON
 * object a line, {"error":{"code":C,"message":M,"field":F}}, whatever the
 * error: C is the daemon's gpushare.v1.Code name for what it refused
 * (UNAVAILABLE when it cannot be reached), USAGE for a command line that is
 * wrong (field: the command), LOCAL for a failure on this side (a file,
 * protoc), JOB_<STATE> for a watched job that did not succeed. Some carry
 * the message that explains them ("plan" of a refused submit, "job").
 */
#ifndef GPUCTL_CLI_H
#define GPUCTL_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "client/client.h"
#include "client/gpuctl.h"

/* --json was given: errors are JSON objects (main sets it first). */
void cli_set_json_errors(int on);
int cli_json_errors(void);
/* An error: "gpuctl: MESSAGE" on stderr, or with --json the object with
 * code, field (may be NULL) and detail as member `key` (may be NULL);
 * returns GPUCTL_EXIT_FAIL. */
int cli_error(const char *code, const char *field, const char *key, const ProtobufCMessage *detail,
              const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* "gpuctl: COMMAND: MESSAGE" and "Try 'gpuctl COMMAND --help'." on stderr;
 * returns GPUCTL_EXIT_USAGE. */
int cli_usage_error(const gpuctl_cli *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A local failure (a file that cannot be read, a spec that does not parse):
 * "gpuctl: MESSAGE" on stderr; returns GPUCTL_EXIT_FAIL. */
int cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* What the daemon refused (rc GS_CLIENT_REFUSED), or why talking to it
 * failed; returns GPUCTL_EXIT_FAIL. */
int cli_report(int rc, const gs_err *e);
/* cli_report with the words `context` first (may be NULL) and, with --json,
 * detail as member `key`. */
int cli_report_detail(int rc, const gs_err *e, const char *context, const char *key,
                      const ProtobufCMessage *detail);

/* Strict decimal: digits only, within [min, max]; else a usage error naming
 * `what`. */
int cli_parse_u64(const gpuctl_cli *x, const char *what, const char *s, uint64_t min, uint64_t max,
                  uint64_t *out);
int cli_parse_u32(const gpuctl_cli *x, const char *what, const char *s, uint32_t min, uint32_t max,
                  uint32_t *out);
/* A whole number, optionally negative, within int32: "-3", "10". */
int cli_parse_i32(const gpuctl_cli *x, const char *what, const char *s, int32_t *out);
/* A size as gs_size_parse reads it (4GiB, 512MiB, 1.5GB). */
int cli_parse_size(const gpuctl_cli *x, const char *what, const char *s, uint64_t *out);
/* A UTC day YYYY-MM-DD from 1970-01-01 to today: *out is its first second
 * (unix time). */
int cli_parse_date(const gpuctl_cli *x, const char *what, const char *s, int64_t *out);
/* A job id: 1 and up. */
int cli_parse_job_id(const gpuctl_cli *x, const char *s, uint64_t *id);

/* Connect to the daemon unless connected already. */
int cli_connect(gpuctl_cli *x);
/* Connect if needed, make the call; on any failure print it and return 1.
 * On a refusal *resp is still set when the daemon sent detail. */
int cli_call(gpuctl_cli *x, Gpushare__V1__Request *req, Gpushare__V1__Response **resp);
/* 0 when r is the result_case asked for; else say so and return 1. */
int cli_expect(Gpushare__V1__Response *r, int result_case);
/* Make one call whose answer is printed as JSON (--json: the result message
 * as it is) or by `human`. */
int cli_simple(gpuctl_cli *x, Gpushare__V1__Request *req, int result_case,
               void (*human)(gpuctl_cli *x, const Gpushare__V1__Response *r));

/* Print text (malloc'd by a formatter, NULL when it ran out of memory) to
 * f and free it. */
void cli_print_text(FILE *f, char *text);

#endif
