/* test_utf8.c: common/utf8.c, which tells text from bytes that are not. */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "common/utf8.h"

static int check(const char *s, size_t n, size_t *at, const char **why) {
  return gs_utf8_text((const uint8_t *)s, n, at, why);
}

Test(utf8, text_passes) {
  const char *ok[] = {"", "alice", "ml-team.2", "caf\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80",
                      "\xf4\x8f\xbf\xbf", "tab\there"};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
    cr_assert_eq(check(ok[i], strlen(ok[i]), NULL, NULL), 0, "case %zu", i);
}

Test(utf8, bytes_that_are_not_text_are_named_with_their_offset) {
  struct {
    const char *s;
    size_t n, at;
    const char *why;
  } bad[] = {
      {"a\0b", 3, 1, "a NUL byte"},
      {"\xff", 1, 0, "not UTF-8"},
      {"ab\xc3", 3, 2, "not UTF-8"},           /* cut short */
      {"\xc3\x28", 2, 0, "not UTF-8"},         /* bad continuation */
      {"\xc0\xaf", 2, 0, "not UTF-8"},         /* overlong '/' */
      {"\xe0\x80\xaf", 3, 0, "not UTF-8"},     /* overlong */
      {"x\xed\xa0\x80", 4, 1, "not UTF-8"},    /* a surrogate */
      {"\xf4\x90\x80\x80", 4, 0, "not UTF-8"}, /* past U+10FFFF */
      {"\xf5\x80\x80\x80", 4, 0, "not UTF-8"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    size_t at = 99;
    const char *why = NULL;
    cr_assert_eq(check(bad[i].s, bad[i].n, &at, &why), -EILSEQ, "case %zu", i);
    cr_assert_eq(at, bad[i].at, "case %zu: at %zu", i, at);
    cr_assert(strstr(why, bad[i].why), "case %zu: %s", i, why);
  }
}
