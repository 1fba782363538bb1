/*
 * common/error.h: gpushare's one error convention.
 *
 * A function that can fail returns 0 (or a count) on success and a negative
 * errno value on failure: -EINVAL, -ENOENT, -ENOMEM, the -errno of a failed
 * system call. Where a person must understand the failure (a job spec, a
 * frame, a size, a CLI argument, a file that cannot be read), the caller
 * also passes a gs_err, which receives a status code that mirrors
 * gpushare.v1.Code, the path of the offending field ("spec.batch_size",
 * "model.layer[2].conv2d.kernel_size") and a sentence that names the value
 * and what is allowed. gs_err_set returns the errno that matches its code
 * (gs_code_errno), so `return gs_err_set(e, GS_INVALID_ARGUMENT, ...)` keeps
 * both halves in step. The daemon copies the three fields straight into its
 * Response, the CLIs print them, so one message serves every surface.
 * Callers test `rc < 0`, and a specific -E value only where they act on it.
 */
#ifndef GS_ERROR_H
#define GS_ERROR_H

#include <stddef.h>

/* Mirrors gpushare.v1.Code in proto/gpushare.proto, number for number. */
enum gs_code {
  GS_OK = 0,
  GS_INVALID_ARGUMENT = 1,
  GS_NOT_FOUND = 2,
  GS_ALREADY_EXISTS = 3,
  GS_PERMISSION_DENIED = 4,
  GS_RESOURCE_EXHAUSTED = 5,
  GS_FAILED_PRECONDITION = 6,
  GS_UNAVAILABLE = 7,
  GS_INTERNAL = 8,
};

typedef struct gs_err {
  int code;        /* enum gs_code; GS_OK when no error was set */
  char field[160]; /* path of the offending field, "" when none applies */
  char msg[768];   /* one or two sentences: what, the value, what is allowed */
} gs_err;

/* The negative errno that stands for a status code: INVALID_ARGUMENT
 * -EINVAL, NOT_FOUND -ENOENT, ALREADY_EXISTS -EEXIST, PERMISSION_DENIED
 * -EACCES, RESOURCE_EXHAUSTED -ENOSPC, FAILED_PRECONDITION -EBUSY,
 * UNAVAILABLE -EAGAIN, anything else -EIO; 0 for GS_OK. */
int gs_code_errno(int code);

/* The negative errno of the error e holds (gs_code_errno of its code; -EIO
 * when e is NULL or holds none): what a function returns after a callee
 * filled e, so `if (gs_store_x(..., e) < 0) return gs_err_rc(e);`. */
int gs_err_rc(const gs_err *e);

/* Fill e (which may be NULL) and return gs_code_errno(code) (-EIO for
 * GS_OK, which is no error to set), so callers can write
 * `return gs_err_set(e, GS_INVALID_ARGUMENT, "batch_size", "...", v);`. */
int gs_err_set(gs_err *e, int code, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Prefix e->field with "prefix." (or set it when empty), e.g. when a nested
 * validator reports "batch_size" and the caller knows it was under "spec". */
void gs_err_prefix(gs_err *e, const char *prefix);

void gs_err_clear(gs_err *e);

/* "INVALID_ARGUMENT" etc.; "UNKNOWN" outside the enum. */
const char *gs_code_name(int code);

#endif
