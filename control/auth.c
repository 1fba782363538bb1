/* auth.c: peer credentials and the decisions of auth.h. */
#include "control/auth.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

int gs_auth_peer_from_fd(int fd, gs_peer *p, gs_err *e) {
  memset(p, 0, sizeof *p);
  struct ucred cred;
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
    return gs_err_set(e, GS_INTERNAL, "", "SO_PEERCRED: %s", strerror(errno));
  p->pid = cred.pid;
  p->uid = cred.uid;
  p->gid = cred.gid;
  p->gids[p->n_gids++] = cred.gid;
  gid_t groups[GS_PEER_GROUPS_MAX];
  len = sizeof groups;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) < 0) {
    /* ERANGE: more groups than we keep. Refuse rather than decide on a
     * partial list, which could miss the admin group. */
    return gs_err_set(e, GS_PERMISSION_DENIED, "",
                      "cannot read the supplementary groups of uid %" PRIu32 ": %s", p->uid,
                      errno == ERANGE ? "more than 255 groups" : strerror(errno));
  }
  for (size_t i = 0; i < len / sizeof groups[0] && p->n_gids < GS_PEER_GROUPS_MAX; i++)
    if (groups[i] != cred.gid) p->gids[p->n_gids++] = groups[i];
  return 0;
}

bool gs_auth_is_admin(const gs_peer *p, bool have_admin_gid, uint32_t admin_gid) {
  if (p->uid == 0) return true;
  if (!have_admin_gid) return false;
  for (size_t i = 0; i < p->n_gids; i++)
    if (p->gids[i] == admin_gid) return true;
  return false;
}

void gs_auth_pick_tenant(const char (*names)[GS_NAME_MAX + 1], const bool *by_uid, size_t n,
                         gs_identity *id) {
  id->tenant[0] = '\0';
  id->ambiguous[0] = '\0';
  for (size_t i = 0; i < n; i++)
    if (by_uid[i]) {
      snprintf(id->tenant, sizeof id->tenant, "%s", names[i]);
      return;
    }
  if (n == 1) {
    snprintf(id->tenant, sizeof id->tenant, "%s", names[0]);
  } else if (n > 1) {
    size_t o = 0;
    for (size_t i = 0; i < n && o < sizeof id->ambiguous; i++)
      o += (size_t)snprintf(id->ambiguous + o, sizeof id->ambiguous - o, "%s%s",
                            i ? ", " : "", names[i]);
  }
}

int gs_auth_identify(gs_store *s, const gs_peer *p, bool have_admin_gid, uint32_t admin_gid,
                     gs_identity *id, gs_err *e) {
  char names[8][GS_NAME_MAX + 1];
  bool by_uid[8];
  size_t n = 0;
  memset(id, 0, sizeof *id);
  id->admin = gs_auth_is_admin(p, have_admin_gid, admin_gid);
  if (gs_store_tenants_of(s, p->uid, p->gids, p->n_gids, names, by_uid, 8, &n, e) < 0)
    return gs_err_rc(e);
  gs_auth_pick_tenant((const char(*)[GS_NAME_MAX + 1])names, by_uid, n, id);
  return 0;
}

int gs_auth_check(const gs_peer *p, const gs_identity *id, gs_need need, const char *call,
                  gs_err *e) {
  switch (need) {
  case GS_NEED_ANY:
    return 0;
  case GS_NEED_ADMIN:
    if (id->admin) return 0;
    return gs_err_set(e, GS_PERMISSION_DENIED, "",
                      "%s needs an admin: uid %" PRIu32 " is not root and not in the admin group",
                      call, p->uid);
  case GS_NEED_TENANT:
    if (id->admin || id->tenant[0]) return 0;
    if (id->ambiguous[0])
      return gs_err_set(e, GS_PERMISSION_DENIED, "",
                        "%s: uid %" PRIu32 " belongs through its groups to several tenants (%s); "
                        "an admin must add the uid itself to one of them",
                        call, p->uid, id->ambiguous);
    return gs_err_set(e, GS_PERMISSION_DENIED, "",
                      "%s: uid %" PRIu32 " is not a member of any tenant; an admin adds it with "
                      "gpuctl tenant create NAME --uid %" PRIu32,
                      call, p->uid, p->uid);
  }
  return gs_err_set(e, GS_INTERNAL, "", "unknown role");
}
