/* common/file.c: read a whole file (see file.h). */
#include "common/file.h"

#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int too_big(const char *path, uint64_t size, uint64_t max, const char *field, gs_err *e) {
  gs_err_set(e, GS_RESOURCE_EXHAUSTED, field, "%s is %llu bytes, over the %llu read here", path,
             (unsigned long long)size, (unsigned long long)max);
  return -EFBIG;
}

int gs_file_read(const char *path, uint64_t max, const char *field, uint8_t **out, size_t *len,
                 gs_err *e) {
  int rc = 0;
  uint8_t *buf = NULL;
  *out = NULL;
  *len = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    rc = -errno;
    gs_err_set(e, rc == -ENOENT ? GS_NOT_FOUND : GS_INVALID_ARGUMENT, field, "cannot open %s: %s",
               path, strerror(errno));
    return rc;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    rc = -errno;
    gs_err_set(e, GS_INTERNAL, field, "cannot stat %s: %s", path, strerror(errno));
    goto fail_fd;
  }
  if (S_ISDIR(st.st_mode)) {
    rc = gs_err_set(e, GS_INVALID_ARGUMENT, field, "%s is a directory, not a regular file", path);
    goto fail_fd;
  }
  /* A regular file's size is known before anything is read; a pipe or a
   * device is read to its end, the cap checked as it grows. */
  bool sized = S_ISREG(st.st_mode);
  if (sized && (uint64_t)st.st_size > max) {
    rc = too_big(path, (uint64_t)st.st_size, max, field, e);
    goto fail_fd;
  }
  size_t cap = sized ? (size_t)st.st_size : 65536, off = 0;
  for (;;) {
    if (!buf || (off == cap && !sized)) {
      if (buf && (uint64_t)off > max) {
        rc = too_big(path, off, max, field, e);
        goto fail_buf;
      }
      if (buf) cap *= 2;
      uint8_t *nb = realloc(buf, cap + 1);
      if (!nb) {
        rc = -ENOMEM;
        gs_err_set(e, GS_RESOURCE_EXHAUSTED, field, "no memory to read the %zu bytes of %s", cap,
                   path);
        goto fail_buf;
      }
      buf = nb;
    }
    if (off == cap) break; /* a regular file, read whole */
    ssize_t r = read(fd, buf + off, cap - off);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      rc = -errno;
      gs_err_set(e, GS_INTERNAL, field, "cannot read %s: %s", path, strerror(errno));
      goto fail_buf;
    }
    if (r == 0) break; /* the end, or a file that shrank while it was read */
    off += (size_t)r;
  }
  if ((uint64_t)off > max) {
    rc = too_big(path, off, max, field, e);
    goto fail_buf;
  }
  close(fd);
  buf[off] = '\0';
  *out = buf;
  *len = off;
  return 0;

fail_buf:
  free(buf);
fail_fd:
  close(fd);
  return rc;
}
