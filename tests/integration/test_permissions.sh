#!/usr/bin/env bash
# Who may make which call: every call of gpushare.v1 (every member of
# Request.call) made by four peers, admin (uid 0), a member of the tenant
# that owns the object, a member of another tenant, and a uid in no tenant
# (65534), against the outcome docs/protocol.md gives (OK, PERMISSION_DENIED,
# NOT_FOUND; FAILED_PRECONDITION where an admin without a tenant acts on
# data, which belongs to a tenant). The table is printed as it runs. Then:
# what a message says about its sender never counts, and the socket has the
# mode and group of the config.
set -u
. "$(dirname "$0")/lib.sh"
need_protoc

FILES=$T/files; mkdir -p "$FILES"; chmod 777 "$FILES"
PEERS=(unknown other owner admin)   # the order each row runs in: admin last
as() { local p=$1; shift
  case $p in
    admin) ctl "$@" ;;
    owner) ctl_as 4001 65534 "$@" ;;
    other) ctl_as 4002 65534 "$@" ;;
    unknown) ctl_as_nobody "$@" ;;
  esac; }
spec() { printf '%s\n' "$2" | protoc --encode=gpushare.v1.JobSpec --proto_path="$PROTO" gpushare.proto >"$FILES/$1.pb"
  chmod 644 "$FILES/$1.pb"; }
json() { $PY -c "import json,sys; d=json.load(sys.stdin); print(eval('d'+sys.argv[1]))" "$1"; }
wait_state() {  # wait_state ID STATE
  local s; for _ in $(seq 300); do
    s=$(ctl --json status "$1" 2>/dev/null | json "['job']['state']" 2>/dev/null)
    [ "$s" = "$2" ] && return 0; sleep 0.1; done
  echo "job $1 is $s, not $2"; return 1; }

start_daemon
mode=$(stat -c %a "$SOCK"); group=$(stat -c %G "$SOCK")
[ "$mode" = "$(sed -n 's/^socket_mode = 0*//p' "$CONF")" ] && pass "socket mode $mode is the config's" || fail "socket mode $mode"
[ "$group" = "$(sed -n 's/^socket_group = //p' "$CONF")" ] && pass "socket group $group is the config's" || fail "socket group $group"

# The world: tenants a (uid 4001, owns everything below) and b (uid 4002).
expect_ok "tenant a" ctl tenant create a --uid 4001
expect_ok "tenant b" ctl tenant create b --uid 4002
expect_ok "tenant zz (to delete)" ctl tenant create zz
expect_ok "vdev a0" ctl vdev create a0 --memory 256MiB --compute 50 --tenant a
expect_ok "vdev b0" ctl vdev create b0 --memory 256MiB --compute 20 --tenant b
expect_ok "vdev vz (to delete)" ctl vdev create vz --memory 1MiB --compute 1 --tenant b
$PY "$HERE/idxfile.py" "$FILES/img" 803 64 8 8; $PY "$HERE/idxfile.py" "$FILES/lab" 801 64; chmod 644 "$FILES/img" "$FILES/lab"
expect_ok "a's dataset da" as owner dataset add da "$FILES/img"
MODEL='model { input { height: 8 width: 8 channels: 1 } layer { flatten {} } layer { dense { units: 4 } } }'
M="$MODEL train { synthetic { examples: 256 seed: 1 classes: 4 } }"
spec short "vdev: \"a0\" $M max_steps: 10"
spec long "vdev: \"a0\" $LONG_JOB"  # lib.sh: runs until cancelled
expect_ok "a's finished job" as owner submit "$FILES/short.pb"
J1=$(as owner --json list | json "['job'][-1]['id']")
wait_state "$J1" SUCCEEDED && pass "job $J1 succeeded" || fail "job $J1 did not succeed"

# A row: CALL, then the expected outcome for admin owner other unknown, then
# the command (a function taking the peer). Each cell prints what happened.
declare -A GOT
printf '%-16s %-22s %-22s %-22s %-22s\n' CALL admin owner other unknown
row() {
  local call=$1; local -A want=([admin]=$2 [owner]=$3 [other]=$4 [unknown]=$5); shift 5
  local p out rc code line
  for p in "${PEERS[@]}"; do
    rc=0; out=$("$@" "$p" 2>&1) || rc=$?
    if [ "$rc" -eq 0 ]; then code=OK
    else code=$(grep -oE 'INVALID_ARGUMENT|NOT_FOUND|ALREADY_EXISTS|PERMISSION_DENIED|RESOURCE_EXHAUSTED|FAILED_PRECONDITION|UNAVAILABLE|INTERNAL' <<<"$out" | head -1)
      code=${code:-exit$rc}; fi
    GOT[$p]=$code
    if [ "$code" != "${want[$p]}" ]; then
      fail "$call as $p: $code, wanted ${want[$p]}: $out"; GOT[$p]="$code (!${want[$p]})"
    elif [ "$p" = unknown ] && [ "$code" = PERMISSION_DENIED ] && [[ "$out" != *"uid 65534"* ]]; then
      fail "$call as unknown: the refusal does not name uid 65534: $out"; GOT[$p]="$code (!uid)"
    else CHECKS=$((CHECKS + 1)); fi
  done
  printf '%-16s %-22s %-22s %-22s %-22s\n' "$call" "${GOT[admin]}" "${GOT[owner]}" "${GOT[other]}" "${GOT[unknown]}"
}
OK=OK PD=PERMISSION_DENIED NF=NOT_FOUND FP=FAILED_PRECONDITION

c_version() { as "$1" version; }
c_devices() { as "$1" devices; }
c_tcreate() { as "$1" tenant create "t-$1"; }
c_tlist() { as "$1" tenant list; }
c_tdelete() { as "$1" tenant delete zz; }
c_qset() { as "$1" quota set a --max-queued 50; }
c_qshow() { as "$1" quota show a; }
c_vcreate() { as "$1" vdev create "v-$1" --memory 1MiB --compute 1 --tenant a; }
c_vlist() { as "$1" vdev list; }
c_vdelete() { as "$1" vdev delete vz; }
c_vset() { as "$1" vdev set b0 --memory 200MiB; }
c_upload() { as "$1" dataset add "d-$1" "$FILES/lab"; }
c_dlist() { as "$1" dataset list; }
c_drm() { as "$1" dataset rm da; }
c_plan() { as "$1" plan "$FILES/short.pb"; }
c_submit() { as "$1" submit "$FILES/long.pb"; }
c_status() { as "$1" status "$J1"; }
c_list() { as "$1" list; }
c_watch() { as "$1" watch "$J1"; }
c_cancel() { local j=$JOWNER; [ "$1" = admin ] && j=$JADMIN; as "$1" cancel "$j"; }
c_logs() { as "$1" logs "$J1"; }
c_fetch() { as "$1" fetch "$J1" -o "$FILES/w-$1.safetensors"; }
c_memory() { as "$1" memory "$J1"; }
c_metrics() { as "$1" metrics; }
c_usage() { as "$1" usage --tenant a; }

#   call            admin owner other unknown
row version         $OK $OK $OK $OK c_version
row list_devices    $OK $OK $OK $OK c_devices
row create_tenant   $OK $PD $PD $PD c_tcreate
row list_tenants    $OK $PD $PD $PD c_tlist
row delete_tenant   $OK $PD $PD $PD c_tdelete
row set_quota       $OK $PD $PD $PD c_qset
row get_quota       $OK $OK $PD $PD c_qshow
row create_vdev     $OK $PD $PD $PD c_vcreate
row list_vdevs      $OK $OK $OK $PD c_vlist
row delete_vdev     $OK $PD $PD $PD c_vdelete
row update_vdev     $OK $PD $PD $PD c_vset
row upload_dataset  $FP $OK $OK $PD c_upload
row list_datasets   $OK $OK $OK $PD c_dlist
row remove_dataset  $FP $OK $NF $PD c_drm
row plan            $OK $OK $NF $PD c_plan
row submit          $OK $OK $NF $PD c_submit
live=$(as owner --json list | $PY -c "import json,sys; print(*sorted(j['id'] for j in json.load(sys.stdin)['job'] if j['state'] in ('QUEUED','RUNNING')))")
read -r JOWNER JADMIN <<<"$live"   # the owner submitted before the admin
[ -n "${JADMIN:-}" ] && pass "the owner's job $JOWNER and the admin's $JADMIN are live" || fail "live jobs: $live"
row job_status      $OK $OK $NF $PD c_status
row list_jobs       $OK $OK $OK $PD c_list
row watch           $OK $OK $NF $PD c_watch
row cancel          $OK $OK $NF $PD c_cancel
row logs            $OK $OK $NF $PD c_logs
row fetch           $OK $OK $NF $PD c_fetch
row memory          $OK $OK $NF $PD c_memory
row metrics         $OK $PD $PD $PD c_metrics
row usage           $OK $OK $PD $PD c_usage

# Every call of the protocol has its row.
calls=$(sed -n '/^message Request {/,/^}/p' "$PROTO/gpushare.proto" | grep -oE '^ +[A-Za-z]+Request [a-z_0-9]+ = ' | awk '{print $2}' | sort)
rows=$(grep -oE '^row [a-z_]+' "$0" | awk '{print $2}' | sort)
[ "$calls" = "$rows" ] && pass "the table has a row for each of the $(wc -w <<<"$calls") calls" \
  || fail "calls without a row: $(comm -23 <(echo "$calls") <(echo "$rows") | tr '\n' ' ')"

# --- what rows showed, in detail ----------------------------------------------
as owner --json vdev list >"$T/v.json"
grep -q '"a0"' "$T/v.json" && ! grep -q '"b0"' "$T/v.json" && pass "the owner lists a0, not b0" || fail "owner vdevs: $(cat "$T/v.json")"
as other --json dataset list >"$T/d.json"
grep -q '"d-other"' "$T/d.json" && ! grep -q '"d-owner"' "$T/d.json" && pass "b lists its own dataset only" || fail "b datasets: $(cat "$T/d.json")"
as other --json list | grep -q "\"id\":$J1," && fail "b lists a's job" || pass "b lists none of a's jobs"
for j in "$JOWNER" "$JADMIN"; do wait_state "$j" CANCELLED >/dev/null && pass "job $j cancelled" || fail "job $j not cancelled"; done
ctl --json status "$JADMIN" | json "['job']['tenant']" | grep -qx a && pass "the admin's submit to a0 runs as tenant a, the vdev's" || fail "admin job tenant"

# --- the message never speaks for its sender --------------------------------------
expect_ok "owner's version names tenant a" as owner --json version
[[ "$LAST_OUT" == *'"uid":4001'* && "$LAST_OUT" == *'"tenant":"a"'* && "$LAST_OUT" == *'"admin":false'* ]] \
  && pass "the daemon sees uid 4001, tenant a, no admin" || fail "version: $LAST_OUT"
expect_fail "owner: create_vdev naming tenant b is still an admin call" 1 PERMISSION_DENIED as owner vdev create x --memory 1MiB --compute 1 --tenant b
expect_fail "other: get_quota naming tenant a" 1 "acts as tenant b and cannot read tenant a" as other quota show a
spec tob "vdev: \"b0\" $M max_steps: 10"
expect_fail "owner: a spec naming b's vdev" 1 "NOT_FOUND" as owner submit "$FILES/tob.pb"
[[ "$LAST_OUT" == *'"b0" for tenant a'* ]] && pass "names the vdev and the peer's own tenant" || fail "$LAST_OUT"
$PY "$HERE/idxfile.py" "$FILES/img2" 803 64 8 8 --seed 2; chmod 644 "$FILES/img2"
expect_ok "a's dataset secret (content only a has)" as owner dataset add secret "$FILES/img2"
sha=$(as owner --json dataset list | $PY -c "import json,sys; print([x['sha256'] for x in json.load(sys.stdin)['dataset'] if x['name'] == 'secret'][0])")
spec steal "vdev: \"b0\" $MODEL train { idx { images: \"sha256:$sha\" labels: \"sha256:$sha\" } }"
expect_fail "other: a's dataset by its hash" 1 NOT_FOUND as other submit "$FILES/steal.pb"
# A Response claiming uid 0 and code OK, sent as a Request by uid 65534: it is
# read as the call in its result field (list_tenants) and judged by the
# kernel's credentials.
expect_ok "a Response-shaped list_tenants from uid 65534" $PY "$HERE/rawframe.py" "$SOCK" --as-uid 65534 --hex '080110001a057569642030 6200'
[[ "$LAST_OUT" == *"code=PERMISSION_DENIED"*"uid 65534"* ]] && pass "refused for uid 65534 whatever the frame says" || fail "$LAST_OUT"
expect_ok "the admin group through a supplementary group" ctl_as 4003 100 --json version
[[ "$LAST_OUT" == *'"admin":true'* ]] && pass "gid 100 (users, the admin_group) makes an admin" || fail "$LAST_OUT"

stop_daemon
finish
