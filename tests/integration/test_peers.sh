#!/usr/bin/env bash
# The daemon knows a peer by its kernel credentials: a non-admin is refused
# for admin calls, the admin group counts through supplementary groups, and
# a tenant sees only its own vdevs.
set -u
. "$(dirname "$0")/lib.sh"
start_daemon

mode=$(stat -c %a "$SOCK"); group=$(stat -c %G "$SOCK")
[ "$mode" = 660 ] && pass "socket mode is 0660" || fail "socket mode $mode"
[ "$group" = nogroup ] && pass "socket group from the config" || fail "socket group $group"

expect_ok "nobody can ask who it is" ctl_as_nobody --json version
[[ "$LAST_OUT" == *'"uid":65534'* && "$LAST_OUT" == *'"admin":false'* ]] \
  && pass "the daemon sees uid 65534, not admin" || fail "version as nobody: $LAST_OUT"
expect_fail "non-admin: tenant create refused" 1 "uid 65534" ctl_as_nobody tenant create x
[[ "$LAST_OUT" == *PERMISSION_DENIED* ]] && pass "PERMISSION_DENIED" || fail "$LAST_OUT"
expect_fail "non-admin: vdev create refused" 1 PERMISSION_DENIED ctl_as_nobody vdev create v --memory 1MiB --compute 1 --tenant x
expect_fail "non-admin: quota set refused" 1 PERMISSION_DENIED ctl_as_nobody quota set x --memory 1GiB
expect_fail "not in any tenant: vdev list refused" 1 "not a member of any tenant" ctl_as_nobody vdev list

# The admin group (users, gid 100) as a supplementary group makes an admin.
expect_ok "admin through a supplementary group" ctl_as 65534 100 tenant create t1 --uid 4001
expect_ok "root creates a second tenant" ctl tenant create t2 --gid 5002
expect_ok "vdev for t1" ctl vdev create v1 --memory 1MiB --compute 10 --tenant t1
expect_ok "vdev for t2" ctl vdev create v2 --memory 1MiB --compute 10 --tenant t2

expect_ok "tenant t1 member lists vdevs" ctl_as 4001 65534 vdev list
[[ "$LAST_OUT" == *v1* && "$LAST_OUT" != *v2* ]] && pass "t1 sees its own vdev only" || fail "t1 saw: $LAST_OUT"
expect_ok "tenant t2 member (by gid) lists vdevs" ctl_as 4002 5002 vdev list
[[ "$LAST_OUT" == *v2* && "$LAST_OUT" != *v1* ]] && pass "t2 sees its own vdev only" || fail "t2 saw: $LAST_OUT"
expect_fail "t1 cannot read t2's quota" 1 PERMISSION_DENIED ctl_as 4001 65534 quota show t2
expect_ok "t1 reads its own quota" ctl_as 4001 65534 quota show t1
expect_fail "a member is not an admin" 1 PERMISSION_DENIED ctl_as 4001 65534 vdev delete v2
expect_ok "groups pointing at one tenant pick it" ctl_as 4003 "5002,5003" --json version
[[ "$LAST_OUT" == *'"tenant":"t2"'* ]] && pass "acts as t2 through gid 5002" || fail "$LAST_OUT"
expect_ok "tenant t3 by gid 5003" ctl tenant create t3 --gid 5003
expect_fail "groups pointing at two tenants are ambiguous" 1 "several tenants" ctl_as 4003 "5002,5003" vdev list
stop_daemon
finish
