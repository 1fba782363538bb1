/* test_size.c: gs_size_parse accepts what people write for memory limits and
 * refuses, with a message naming the text, everything else; gs_size_format
 * prints what the tables show. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "common/size.h"

static uint64_t ok(const char *s) {
  uint64_t v = 12345;
  gs_err e = {0};
  int rc = gs_size_parse(s, &v, &e);
  cr_assert_eq(rc, 0, "\"%s\" refused: %s", s, e.msg);
  return v;
}

static void refused(const char *s, const char *needle) {
  uint64_t v = 777;
  gs_err e = {0};
  int rc = gs_size_parse(s, &v, &e);
  cr_assert_lt(rc, 0, "\"%s\" accepted as %llu", s, (unsigned long long)v);
  cr_assert_eq(v, 777, "\"%s\": output written on refusal", s);
  cr_assert_eq(e.code, GS_INVALID_ARGUMENT);
  cr_assert_str_empty(e.field);
  cr_assert(strstr(e.msg, needle), "\"%s\": message \"%s\" lacks \"%s\"", s, e.msg, needle);
}

Test(size, binary_suffixes) {
  cr_assert_eq(ok("4GiB"), 4ull << 30);
  cr_assert_eq(ok("512MiB"), 512ull << 20);
  cr_assert_eq(ok("64k"), 64ull << 10);
  cr_assert_eq(ok("64K"), 64ull << 10);
  cr_assert_eq(ok("2 MiB"), 2ull << 20);
  cr_assert_eq(ok("1kib"), 1024);
  cr_assert_eq(ok("3T"), 3ull << 40);
  cr_assert_eq(ok("1TiB"), 1ull << 40);
  cr_assert_eq(ok("1.5GiB"), 3ull << 29);
  cr_assert_eq(ok("0.5k"), 512);
}

Test(size, decimal_suffixes) {
  cr_assert_eq(ok("1.5GB"), 1500000000ull);
  cr_assert_eq(ok("1kB"), 1000);
  cr_assert_eq(ok("2MB"), 2000000);
  cr_assert_eq(ok("7tb"), 7000000000000ull);
  cr_assert_eq(ok("0.001kB"), 1);
  cr_assert_eq(ok("0.0001kB"), 0); /* below a byte rounds down */
}

Test(size, plain_bytes) {
  cr_assert_eq(ok("1024"), 1024);
  cr_assert_eq(ok("0"), 0);
  cr_assert_eq(ok("17B"), 17);
  cr_assert_eq(ok("17 b"), 17);
}

Test(size, boundaries) {
  cr_assert_eq(ok("18446744073709551615"), UINT64_MAX);
  cr_assert_eq(ok("15EiB"), 15ull << 60);
  cr_assert_eq(ok("18EB"), 18000000000000000000ull);
  refused("18446744073709551616", "larger than the largest");
  refused("16EiB", "larger than the largest");
  refused("16E", "larger than the largest");
  refused("19EB", "larger than the largest");
  refused("16.0EiB", "larger than the largest");
  refused("18.5EB", "larger than the largest");
  cr_assert_eq(ok("18.4EB"), 18400000000000000000ull);
  cr_assert_eq(ok("15.9999999999999999999EiB"), UINT64_MAX); /* rounds down below 16 EiB */
  refused("99999999999999999999999999", "larger than the largest");
}

Test(size, refusals_name_the_text) {
  refused("", "empty");
  refused("-1", "\"-1\" has a sign");
  refused("+5", "sign");
  refused("4XB", "unknown suffix \"XB\"");
  refused("4GiBx", "unknown suffix \"GiBx\"");
  refused("12 34", "unknown suffix \"34\"");
  refused("4  GiB", "unknown suffix");
  refused("1024 ", "ends with a space");
  refused("nan", "does not start with a digit");
  refused("inf", "does not start with a digit");
  refused("0x10", "unknown suffix \"x10\"");
  refused("1e9", "unknown suffix \"e9\"");
  refused("1.", "no digit after the decimal point");
  refused(".5G", "does not start with a digit");
  refused("1.5", "fraction of a byte");
  refused(" 4G", "does not start with a digit");
}

Test(size, refusal_mentions_allowed_suffixes) {
  gs_err e = {0};
  uint64_t v;
  cr_assert_lt(gs_size_parse("4XB", &v, &e), 0);
  cr_assert(strstr(e.msg, "MiB") && strstr(e.msg, "GB"), "%s", e.msg);
}

Test(size, format) {
  char buf[32];
  cr_assert_str_eq(gs_size_format(5368709120ull, buf, sizeof buf), "5.00 GiB");
  cr_assert_str_eq(gs_size_format(512, buf, sizeof buf), "512 B");
  cr_assert_str_eq(gs_size_format(0, buf, sizeof buf), "0 B");
  cr_assert_str_eq(gs_size_format(1023, buf, sizeof buf), "1023 B");
  cr_assert_str_eq(gs_size_format(1024, buf, sizeof buf), "1.00 KiB");
  cr_assert_str_eq(gs_size_format(1536, buf, sizeof buf), "1.50 KiB");
  cr_assert_str_eq(gs_size_format((1ull << 20) - 1, buf, sizeof buf), "1.00 MiB");
  /* Not "16.00 EiB": that is past UINT64_MAX, and what gpushare prints must
   * parse back (fuzz_size found the old rounding up). */
  cr_assert_str_eq(gs_size_format(UINT64_MAX, buf, sizeof buf), "15.99 EiB");
  uint64_t back = 0;
  cr_assert_eq(gs_size_parse("15.99 EiB", &back, NULL), 0);
}

Test(size, format_then_parse_round_trips_whole_units) {
  char buf[32];
  uint64_t vals[] = {1ull << 30, 3ull << 20, 7ull << 40};
  for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
    gs_size_format(vals[i], buf, sizeof buf);
    cr_assert_eq(ok(buf), vals[i], "%s", buf);
  }
}
