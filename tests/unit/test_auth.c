/* test_auth.c: who is an admin, which tenant a peer acts as, who may call what. */
#include <criterion/criterion.h>
#include <string.h>

#include "control/auth.h"

static gs_peer peer(uint32_t uid, const uint32_t *gids, size_t n) {
  gs_peer p = {.uid = uid, .gid = n ? gids[0] : uid};
  for (size_t i = 0; i < n; i++) p.gids[p.n_gids++] = gids[i];
  return p;
}

Test(auth, root_is_admin) {
  gs_peer p = peer(0, NULL, 0);
  cr_assert(gs_auth_is_admin(&p, false, 0));
}

Test(auth, admin_group_through_supplementary_groups) {
  uint32_t g[] = {100, 999};
  gs_peer p = peer(1000, g, 2);
  cr_assert(gs_auth_is_admin(&p, true, 999), "a supplementary admin group counts");
  cr_assert_not(gs_auth_is_admin(&p, true, 998));
  cr_assert_not(gs_auth_is_admin(&p, false, 999), "a missing admin group makes nobody admin");
}

Test(auth, uid_membership_wins) {
  char names[2][GS_NAME_MAX + 1] = {"viagroup", "viauid"};
  bool by_uid[2] = {false, true};
  gs_identity id = {0};
  gs_auth_pick_tenant((const char(*)[GS_NAME_MAX + 1])names, by_uid, 2, &id);
  cr_assert_str_eq(id.tenant, "viauid");
}

Test(auth, two_tenants_through_groups_is_ambiguous) {
  char names[2][GS_NAME_MAX + 1] = {"a", "b"};
  bool by_uid[2] = {false, false};
  gs_identity id = {0};
  gs_auth_pick_tenant((const char(*)[GS_NAME_MAX + 1])names, by_uid, 2, &id);
  cr_assert_str_eq(id.tenant, "");
  cr_assert_str_eq(id.ambiguous, "a, b");
  gs_peer p = peer(7, NULL, 0);
  gs_err e;
  cr_assert_lt(gs_auth_check(&p, &id, GS_NEED_TENANT, "submit", &e), 0);
  cr_assert_eq(e.code, GS_PERMISSION_DENIED);
  cr_assert(strstr(e.msg, "several tenants (a, b)"), "%s", e.msg);
}

Test(auth, roles) {
  gs_peer p = peer(65534, NULL, 0);
  gs_identity none = {0}, tenant = {0}, admin = {.admin = true};
  strcpy(tenant.tenant, "t");
  gs_err e;
  cr_assert_eq(gs_auth_check(&p, &none, GS_NEED_ANY, "version", &e), 0);
  cr_assert_lt(gs_auth_check(&p, &none, GS_NEED_TENANT, "list_vdevs", &e), 0);
  cr_assert(strstr(e.msg, "uid 65534"), "the refusal names the uid: %s", e.msg);
  cr_assert_eq(gs_auth_check(&p, &tenant, GS_NEED_TENANT, "list_vdevs", &e), 0);
  cr_assert_lt(gs_auth_check(&p, &tenant, GS_NEED_ADMIN, "create_vdev", &e), 0);
  cr_assert_eq(e.code, GS_PERMISSION_DENIED);
  cr_assert(strstr(e.msg, "create_vdev needs an admin"), "%s", e.msg);
  cr_assert_eq(gs_auth_check(&p, &admin, GS_NEED_ADMIN, "create_vdev", &e), 0);
}
