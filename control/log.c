/* log.c: see log.h. */
#include "control/log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int max_level = GS_LOG_INFO;

int gs_log_set_level(const char *name) {
  static const struct { const char *name; int level; } levels[] = {
      {"error", GS_LOG_ERROR}, {"warn", GS_LOG_WARN}, {"info", GS_LOG_INFO}, {"debug", GS_LOG_DEBUG}};
  for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++)
    if (strcmp(name, levels[i].name) == 0) {
      max_level = levels[i].level;
      return 0;
    }
  return -EINVAL;
}

void gs_log(int level, const char *fmt, ...) {
  if (level > max_level) return;
  char line[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  if (getenv("JOURNAL_STREAM")) {
    fprintf(stderr, "<%d>%s\n", level, line);
  } else {
    static const char *const names[8] = {"", "", "", "error", "warn", "", "info", "debug"};
    char ts[32];
    time_t now = time(NULL);
    struct tm tm;
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", localtime_r(&now, &tm));
    fprintf(stderr, "%s gpushared %s: %s\n", ts, names[level & 7], line);
  }
  fflush(stderr);
}
