/*
 * common/file.h: read a whole file, the one way gpushare does it.
 *
 * Job files, IDX datasets, checkpoints and test fixtures are all read into
 * one malloc'd buffer. The size comes from fstat, not from the contents, and
 * is checked against the caller's cap before anything is allocated, so a
 * huge file is refused with its size and the cap. A pipe or a device (a
 * job piped in as /dev/stdin) has no size: it is read to its end, refused
 * as soon as it passes the cap. A file that shrinks while it is read
 * yields what was there.
 */
#ifndef GS_COMMON_FILE_H
#define GS_COMMON_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "common/error.h"

/* Read the file at `path` (regular, a pipe or a device) into *out (malloc'd, with a NUL byte after
 * the *len bytes so text can be used as a string). Refuses a file of more
 * than `max` bytes with -EFBIG (RESOURCE_EXHAUSTED). Errors name `field`
 * (may be NULL): -ENOENT (NOT_FOUND) when it does not exist, -EINVAL when it
 * is a directory or cannot be opened, -ENOMEM, or the -errno of a failed
 * read (INTERNAL). Returns 0 or that negative errno with e filled. */
int gs_file_read(const char *path, uint64_t max, const char *field, uint8_t **out, size_t *len,
                 gs_err *e);

#endif
