#!/bin/sh
# etcd-smoke: workload for the 3-node etcd example (installed in the image as
# /usr/local/bin/etcd-smoke). Waits until every member reports healthy, writes
# foo=bar, reads it back and prints the members' status (who leads).
# Exit 0 on success; nonzero with an "etcd-smoke: FAIL: ..." line otherwise.
#
# Environment (all optional):
#   ETCD_ENDPOINTS    comma-separated client URLs
#                     (default http://192.0.2.{1,2,3}:2379)
#   ETCD_WAIT_TRIES   health checks before giving up, 0.2 s apart (default 300)
set -u
export ETCDCTL_API=3
EP=${ETCD_ENDPOINTS:-http://192.0.2.1:2379,http://192.0.2.2:2379,http://192.0.2.3:2379}
TRIES=${ETCD_WAIT_TRIES:-300}
N=$(echo "$EP" | tr ',' '\n' | grep -c .)

now() { cut -d' ' -f1 /proc/uptime 2>/dev/null || echo '?'; }
say() { echo "etcd-smoke [t=$(now)s]: $*"; }
fail() { echo "etcd-smoke: FAIL: $*"; exit 1; }

say "waiting for $N healthy members: $EP"
i=0
while :; do
    i=$((i + 1))
    out=$(etcdctl --endpoints="$EP" --dial-timeout=1s --command-timeout=2s endpoint health 2>&1)
    rc=$?
    healthy=$(echo "$out" | grep -c 'is healthy')
    [ "$rc" -eq 0 ] && [ "$healthy" -eq "$N" ] && break
    if [ "$i" -ge "$TRIES" ]; then
        echo "$out"
        fail "cluster not healthy after $i tries ($healthy of $N members healthy)"
    fi
    sleep 0.2
done
echo "$out" | sort
say "all $N members healthy after $i tries"

out=$(etcdctl --endpoints="$EP" --command-timeout=5s put foo bar 2>&1) ||
    fail "put foo bar: $out"
[ "$out" = OK ] || fail "put foo bar printed '$out', expected OK"
say "put foo bar: $out"

val=$(etcdctl --endpoints="$EP" --command-timeout=5s get foo --print-value-only 2>&1) ||
    fail "get foo: $val"
echo "$val"
[ "$val" = bar ] || fail "get foo returned '$val', expected 'bar'"
say "get foo: $val"

etcdctl --endpoints="$EP" --command-timeout=5s endpoint status -w table ||
    fail "endpoint status failed"
say "PASS"
exit 0
