#!/usr/bin/env bash
# test_completion.sh: the bash completion of gpuctl (completion/gpuctl.bash).
#
# Usage: test_completion.sh GPUSHARED GPUCTL   (exit 0 pass, 1 fail, 77 skip)
#
# Sources the completion script, sets COMP_WORDS/COMP_CWORD/COMP_LINE as
# bash would for a command line, calls _gpuctl and reads COMPREPLY:
#   - every command and subcommand of `gpuctl --help` is completed, and
#     each command's flags are exactly those of `gpuctl CMD --help` (plus
#     the global --socket, --json, --help);
#   - without a daemon the names it would ask for complete to nothing, and
#     quietly;
#   - against a real gpushared: vdev, tenant, dataset and device names and
#     job ids, on the socket given by --socket, --socket=, or
#     GPUSHARE_SOCKET; files by their extension.
set -u
. "$(dirname "$0")/lib.sh"
SRC=${GS_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
COMPLETION=$SRC/completion/gpuctl.bash
# shellcheck source=/dev/null
. "$COMPLETION" || { fail "cannot source $COMPLETION"; finish; exit 1; }
declare -F _gpuctl >/dev/null && pass "completion/gpuctl.bash defines _gpuctl" \
  || { fail "no _gpuctl function"; finish; exit 1; }
[ "$(complete -p gpuctl 2>/dev/null)" = "complete -F _gpuctl gpuctl" ] \
  && pass "complete -F _gpuctl gpuctl" || fail "gpuctl has no completion: $(complete -p gpuctl 2>&1)"

# comp LINE: COMPREPLY for the cursor at the end of LINE ("gpuctl ..."),
# one per line, sorted; stderr of the completion goes to $T/comp.err.
comp() {
  local line="$GPUCTL${1#gpuctl}"
  local words split=${line//--socket=/--socket = }  # bash splits words at '='
  read -r -a words <<<"$split"
  [[ "$line" == *" " ]] && words+=("")
  COMP_WORDS=("${words[@]}")
  COMP_CWORD=$((${#words[@]} - 1))
  COMP_LINE=$line
  COMP_POINT=${#line}
  COMPREPLY=()
  _gpuctl "$GPUCTL" "${words[COMP_CWORD]}" "${words[COMP_CWORD - 1]}" 2>>"$T/comp.err"
  printf '%s\n' "${COMPREPLY[@]}" | sed '/^$/d' | sort -u
}
# has LINE WORD...: the completions of LINE include every WORD.
has() { local line=$1; shift
  local got; got=$(comp "$line")
  local w missing=
  for w in "$@"; do grep -qxF -- "$w" <<<"$got" || missing+=" $w"; done
  [ -z "$missing" ] && pass "'$line' completes $*" \
    || fail "'$line' lacks$missing; got: $(echo $got)"; }

# --- commands and flags against --help -------------------------------------
mapfile -t cmds < <("$GPUCTL" --help | sed -n '/^commands:/,/^$/p' | sed '1d;/^$/d' \
  | sed 's/^ *//; s/  .*//' | awk '{ s = $1; if ($2 ~ /^[a-z][a-z-]*$/) s = s " " $2; print s }')
[ "${#cmds[@]}" -ge 20 ] && pass "gpuctl --help lists ${#cmds[@]} commands" \
  || fail "gpuctl --help lists ${#cmds[@]} commands: ${cmds[*]}"
top=$(comp "gpuctl ")
for c in "${cmds[@]}"; do
  w1=${c%% *}
  grep -qxF "$w1" <<<"$top" || fail "'gpuctl ' does not complete $w1"
  if [ "$c" != "$w1" ]; then
    sub=$(comp "gpuctl $w1 ")
    grep -qxF "${c#* }" <<<"$sub" || fail "'gpuctl $w1 ' does not complete ${c#* }"
  fi
  want=$("$GPUCTL" $c --help | sed -n '/^options:/,/^$/p' | sed '1d;/^$/d' \
    | awk '{ print $1 }' | sed 's/,$//' | sort -u)
  want=$( (echo "$want"; "$GPUCTL" $c --help | sed -n '/^options:/,/^$/p' | sed '1d;/^$/d' \
    | awk '$1 ~ /,$/ { print $2 }'; printf '%s\n' --socket --json --help) | sed '/^$/d' | sort -u)
  got=$(comp "gpuctl $c -")
  [ "$got" = "$want" ] && pass "gpuctl $c: flags $(echo $want | sed 's/--socket --json --help//; s/^ *//')" \
    || fail "gpuctl $c: completes flags [$(echo $got)], --help says [$(echo $want)]"
done
has "gpuctl ve" version
has "gpuctl vdev create x --policy " preallocate growth

# --- files by extension -----------------------------------------------------
mkdir -p "$T/files/sub" && touch "$T/files/a.txtpb" "$T/files/b.pb" "$T/files/c.txt"
got=$(comp "gpuctl job encode $T/files/")
[ "$got" = "$(printf '%s\n' "$T/files/a.txtpb" "$T/files/sub" | sort)" ] \
  && pass "job encode completes *.txtpb and directories" || fail "job encode completes: $(echo $got)"
got=$(comp "gpuctl submit $T/files/")
[ "$got" = "$(printf '%s\n' "$T/files/b.pb" "$T/files/sub" | sort)" ] \
  && pass "submit completes *.pb and directories" || fail "submit completes: $(echo $got)"

# --- no daemon: nothing, quietly --------------------------------------------
: >"$T/comp.err"
for line in "gpuctl --socket $SOCK vdev delete " "gpuctl --socket $SOCK status " \
  "gpuctl --socket $SOCK vdev create x --tenant "; do
  got=$(comp "$line")
  [ -z "$got" ] && pass "no daemon: '${line#gpuctl --socket $SOCK }' completes nothing" \
    || fail "no daemon: '$line' completes $got"
done
[ ! -s "$T/comp.err" ] && pass "no daemon: nothing on stderr" || fail "stderr: $(cat "$T/comp.err")"

# --- a real daemon ----------------------------------------------------------
if [ "$(id -u)" -ne 0 ]; then
  echo "skip - names from the daemon: creating a tenant and a vdev needs root (admin)"
  finish; exit
fi
need_protoc
start_daemon
expect_ok "tenant comptenant" ctl tenant create comptenant --uid "$(id -u)"
expect_ok "vdev compvdev" ctl vdev create compvdev --memory 256MiB --compute 50 --tenant comptenant
printf '%s vdev: "compvdev"\n' "$LONG_JOB" >"$T/long.txtpb"
protoc --encode=gpushare.v1.JobSpec --proto_path="$PROTO" gpushare.proto <"$T/long.txtpb" >"$T/long.pb"
expect_ok "submit a long job" ctl submit "$T/long.pb"
JOB=$(sed -n 's/^job \([0-9]*\) submitted.*/\1/p' <<<"$LAST_OUT")
[ -n "$JOB" ] && pass "job $JOB submitted" || fail "no job id in: $LAST_OUT"
# An IDX file of two labels: magic 0x00000801, one dimension of 2.
idx=$T/labels.idx1
printf '\x00\x00\x08\x01\x00\x00\x00\x02\x01\x02' >"$idx"
expect_ok "dataset compdata (IDX)" ctl dataset add compdata "$idx"

has "gpuctl --socket $SOCK vdev delete " compvdev
has "gpuctl --socket=$SOCK vdev set " compvdev
has "gpuctl --socket $SOCK submit x.pb --vdev " compvdev
has "gpuctl --socket $SOCK quota show " comptenant
has "gpuctl --socket $SOCK vdev create v2 --tenant " comptenant
has "gpuctl --socket $SOCK dataset rm " compdata
has "gpuctl --socket $SOCK vdev create v2 --device " cpu
has "gpuctl --socket $SOCK status " "$JOB"
has "gpuctl --socket $SOCK cancel " "$JOB"
GPUSHARE_SOCKET=$SOCK has "gpuctl logs " "$JOB"
got=$(comp "gpuctl --socket $SOCK vdev delete compvdev ")
[ -z "$got" ] && pass "vdev delete takes one name" || fail "a second vdev name completes: $got"
expect_ok "cancel job $JOB" ctl cancel "$JOB"
stop_daemon
finish
