/*
 * fuzz_tmp.h: the scratch directory of the fuzz targets that need files
 * (fuzz_ckpt, fuzz_idx, fuzz_request): made once under $TMPDIR (or /tmp) in
 * LLVMFuzzerInitialize, emptied of the files a target writes and removed at
 * exit.
 */
#ifndef GS_FUZZ_TMP_H
#define GS_FUZZ_TMP_H

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* mkdtemp DIR/gs-fuzz-TARGET-XXXXXX into dir, or exit(1) saying why. */
static inline void fuzz_tmpdir_make(char *dir, size_t len, const char *target) {
  const char *t = getenv("TMPDIR");
  snprintf(dir, len, "%s/gs-fuzz-%s-XXXXXX", t && *t ? t : "/tmp", target);
  if (!mkdtemp(dir)) {
    fprintf(stderr, "fuzz_%s: mkdtemp %s: ", target, dir);
    perror("");
    exit(1);
  }
}

/* unlink dir/NAME for each of the n names, then rmdir dir. */
static inline void fuzz_tmpdir_remove(const char *dir, const char *const *names, size_t n) {
  char p[PATH_MAX];
  for (size_t i = 0; i < n; i++) {
    snprintf(p, sizeof p, "%s/%s", dir, names[i]);
    unlink(p);
  }
  rmdir(dir);
}

#endif
