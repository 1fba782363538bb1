/*
 * log.h: gpushared's log lines.
 *
 * One line per event on stderr, which systemd sends to the journal. Under
 * systemd (JOURNAL_STREAM set) each line starts with the sd-daemon priority
 * prefix ("<3>" error ... "<7>" debug) so journalctl -p works; elsewhere
 * with a timestamp and the level. A daemonised gpushared (no --foreground)
 * points stderr at STATE_DIR/gpushared.log.
 */
#ifndef GS_LOG_H
#define GS_LOG_H

enum gs_log_level { GS_LOG_ERROR = 3, GS_LOG_WARN = 4, GS_LOG_INFO = 6, GS_LOG_DEBUG = 7 };

/* "error", "warn", "info", "debug"; returns -EINVAL for anything else. */
int gs_log_set_level(const char *name);
void gs_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define gs_error(...) gs_log(GS_LOG_ERROR, __VA_ARGS__)
#define gs_warn(...) gs_log(GS_LOG_WARN, __VA_ARGS__)
#define gs_info(...) gs_log(GS_LOG_INFO, __VA_ARGS__)
#define gs_debug(...) gs_log(GS_LOG_DEBUG, __VA_ARGS__)

#endif
