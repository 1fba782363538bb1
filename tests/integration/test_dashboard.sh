#!/usr/bin/env bash
# docs/grafana/gpushare.json asks only for metrics gpushared exports: every
# metric name in every PromQL expression of the dashboard (panel targets
# and template variable queries) has a sample in `gpuctl metrics` of a
# daemon with a tenant, a vdev, a job that ran and a job running.
set -u
. "$(dirname "$0")/lib.sh"
need_protoc
DASH=${GS_SOURCE_DIR:-$HERE/../..}/docs/grafana/gpushare.json
start_daemon
expect_ok "tenant a" ctl tenant create a --uid 4001
expect_ok "vdev a0" ctl vdev create a0 --memory 256MiB --compute 50 --tenant a
printf 'name: "short" vdev: "a0" %s max_steps: 30\n' "$LONG_JOB" |
  protoc --encode=gpushare.v1.JobSpec --proto_path="$PROTO" gpushare.proto >"$T/short.pb"
printf 'name: "long" vdev: "a0" %s\n' "$LONG_JOB" |
  protoc --encode=gpushare.v1.JobSpec --proto_path="$PROTO" gpushare.proto >"$T/long.pb"
chmod 644 "$T/short.pb" "$T/long.pb"
expect_ok "a job runs to its end" ctl_as 4001 65534 submit "$T/short.pb" --watch
out=$(ctl_as 4001 65534 submit "$T/long.pb" 2>&1)
[[ "$out" =~ ^job\ ([0-9]+)\ submitted ]] && id=${BASH_REMATCH[1]} || { fail "submit: $out"; finish; exit 1; }
wait_state "$id" RUNNING && pass "a job runs" || fail "job $id not running"
ctl metrics >"$T/metrics.txt"
$PY - "$DASH" "$T/metrics.txt" <<'PY' && pass "every metric the dashboard queries is exported" || fail "the dashboard queries metrics gpushared does not export"
import json, re, sys
d = json.load(open(sys.argv[1]))
exprs = []
def walk(p):
    for t in p.get("targets", []): exprs.append(t["expr"])
    for q in p.get("panels", []): walk(q)
walk(d)
for v in d["templating"]["list"]:
    q = v.get("query")
    exprs.append(q["query"] if isinstance(q, dict) else q)
have = {l.split("{")[0].split(" ")[0] for l in open(sys.argv[2]) if l.strip() and not l.startswith("#")}
want = set()
for e in exprs:
    e = re.sub(r'"[^"]*"', '""', e)           # label values
    want |= set(re.findall(r"\bgpushare_[a-zA-Z0-9_:]*", e))
missing = sorted(want - have)
print("%d expressions, %d metrics" % (len(exprs), len(want)))
if not want or missing:
    print("not exported:", " ".join(missing) or "(no metric found)")
    sys.exit(1)
PY
ctl_as 4001 65534 cancel "$id" >/dev/null
stop_daemon
finish
