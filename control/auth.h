/*
 * auth.h: who a peer on the control socket is, and what it may do.
 *
 * The daemon knows a peer only by its kernel credentials, read once at
 * accept: SO_PEERCRED (pid, uid, primary gid) and SO_PEERGROUPS (the
 * supplementary groups; SO_PEERCRED's gid alone would miss an admin whose
 * admin group is supplementary). Nothing a message says about its sender is
 * ever believed. From the credentials:
 *  - admin: uid 0, or a member (primary or supplementary) of the configured
 *    admin group. Admins manage tenants, quotas and vdevs and see all jobs.
 *  - tenant: the tenant whose members include the uid; failing that, the one
 *    tenant one of its gids belongs to. A uid can be in one tenant only and
 *    so can a gid, but a person's groups may point at two tenants: that is
 *    refused as ambiguous rather than guessed.
 * Each RPC states the role it needs (gs_need); gs_auth_check decides.
 */
#ifndef GS_AUTH_H
#define GS_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/error.h"
#include "control/store.h"

#define GS_PEER_GROUPS_MAX 256

typedef struct gs_peer {
  pid_t pid;
  uint32_t uid;
  uint32_t gid;                        /* primary */
  uint32_t gids[GS_PEER_GROUPS_MAX];   /* primary first, then supplementary */
  size_t n_gids;
} gs_peer;

typedef enum gs_need {
  GS_NEED_ANY = 0,    /* anyone who can connect (version) */
  GS_NEED_TENANT = 1, /* an admin, or a member of some tenant */
  GS_NEED_ADMIN = 2,
} gs_need;

typedef struct gs_identity {
  bool admin;
  char tenant[GS_NAME_MAX + 1]; /* "" when the peer belongs to no tenant */
  char ambiguous[256];          /* non-empty: the tenants its groups point at */
} gs_identity;

/* Read SO_PEERCRED and SO_PEERGROUPS of a connected AF_UNIX socket. */
int gs_auth_peer_from_fd(int fd, gs_peer *p, gs_err *e);

/* Pure decision: is the peer an admin given the admin group's gid
 * (have_admin_gid false when the group does not exist on this machine)? */
bool gs_auth_is_admin(const gs_peer *p, bool have_admin_gid, uint32_t admin_gid);

/* Pure decision: which tenant from the store's candidates (names[i],
 * matched through the uid when by_uid[i]). */
void gs_auth_pick_tenant(const char (*names)[GS_NAME_MAX + 1], const bool *by_uid, size_t n,
                         gs_identity *id);

/* The whole resolution against the store. */
int gs_auth_identify(gs_store *s, const gs_peer *p, bool have_admin_gid, uint32_t admin_gid,
                     gs_identity *id, gs_err *e);

/* 0 when id may make a call needing `need`; else PERMISSION_DENIED naming the
 * uid and the call. */
int gs_auth_check(const gs_peer *p, const gs_identity *id, gs_need need, const char *call,
                  gs_err *e);

#endif
