/* common/file.c: read a whole file (see file.h). */
#include "common/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
  if (!S_ISREG(st.st_mode)) {
    rc = gs_err_set(e, GS_INVALID_ARGUMENT, field, "%s is not a regular file", path);
    goto fail_fd;
  }
  if ((uint64_t)st.st_size > max) {
    rc = -EFBIG;
    gs_err_set(e, GS_RESOURCE_EXHAUSTED, field, "%s is %llu bytes, over the %llu read here", path,
               (unsigned long long)st.st_size, (unsigned long long)max);
    goto fail_fd;
  }
  size_t n = (size_t)st.st_size;
  buf = malloc(n + 1);
  if (!buf) {
    rc = -ENOMEM;
    gs_err_set(e, GS_RESOURCE_EXHAUSTED, field, "no memory to read the %zu bytes of %s", n, path);
    goto fail_fd;
  }
  size_t off = 0;
  while (off < n) {
    ssize_t r = read(fd, buf + off, n - off);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      rc = -errno;
      gs_err_set(e, GS_INTERNAL, field, "cannot read %s: %s", path, strerror(errno));
      goto fail_buf;
    }
    if (r == 0) break; /* shrank while we read: what is there */
    off += (size_t)r;
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
