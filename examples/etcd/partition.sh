#!/bin/sh
# etcd-partition: observation workload for a network-partition scenario of the
# 3-node etcd example (installed in the image as /usr/local/bin/etcd-partition).
#
#   etcd-partition [SECONDS [INTERVAL]]      defaults: 20 s, 0.2 s
#
# Waits for a leader and prints it, then for SECONDS keeps writing through each
# member in turn (`put`, --command-timeout=1s) and prints one line per attempt:
#
#   etcd-partition [t=12.34s] round 7 n2 http://192.0.2.2:2379 OK
#   etcd-partition [t=13.41s] round 7 n3 http://192.0.2.3:2379 FAIL (context deadline exceeded)
#
# t is the guest's uptime (/proc/uptime), which is deterministic under
# detvisor. Whenever the leader that the members report changes, it prints a
# "leader" line. While a partition isolates a minority member, writes through
# it fail (no leader on its side) while the majority keeps accepting them; after
# the heal all members accept writes again. It ends with a per-member summary.
# Run it where it can reach every member (its own node, not a member's
# namespaces, or a partition would cut the workload off too).
# Exit 0 if at least one write succeeded, 1 if none did or no leader appeared.
#
# Environment: ETCD_ENDPOINTS (default http://192.0.2.{1,2,3}:2379); members
# are named n1, n2, ... in that order. ETCD_WAIT_TRIES (default 300, 0.2 s apart).
set -u
export ETCDCTL_API=3
DURATION=${1:-20}
INTERVAL=${2:-0.2}
EP=${ETCD_ENDPOINTS:-http://192.0.2.1:2379,http://192.0.2.2:2379,http://192.0.2.3:2379}
TRIES=${ETCD_WAIT_TRIES:-300}
EPS=$(echo "$EP" | tr ',' ' ')

now() { cut -d' ' -f1 /proc/uptime; }
say() { echo "etcd-partition [t=$(now)s] $*"; }

# leader: prints the client URL of the member(s) that report being leader,
# among those that answer within 1 s (simple output: field 5 is IS LEADER).
leader() {
    etcdctl --endpoints="$EP" --dial-timeout=1s --command-timeout=1s \
        endpoint status 2>/dev/null |
        awk -F', ' '$5 == "true" { printf "%s%s", sep, $1; sep = " " }'
}

i=0
lead=
while [ -z "$lead" ]; do
    i=$((i + 1))
    lead=$(leader)
    if [ -z "$lead" ]; then
        [ "$i" -ge "$TRIES" ] && { say "FAIL: no leader after $i tries"; exit 1; }
        sleep 0.2
    fi
done
say "leader: $lead"

start=$(now)
round=0
ok_total=0
summary=
idx=0
for e in $EPS; do
    idx=$((idx + 1))
    eval "ok_$idx=0 fail_$idx=0"
done
while awk -v s="$start" -v n="$(now)" -v d="$DURATION" 'BEGIN { exit !(n - s < d) }'; do
    round=$((round + 1))
    idx=0
    for e in $EPS; do
        idx=$((idx + 1))
        out=$(etcdctl --endpoints="$e" --dial-timeout=1s --command-timeout=1s \
            put "partition/n$idx" "round-$round" 2>&1)
        if [ $? -eq 0 ]; then
            say "round $round n$idx $e OK"
            eval "ok_$idx=\$((ok_$idx + 1))"
            ok_total=$((ok_total + 1))
        else
            why=$(echo "$out" | tail -n 1 | sed 's/^{.*"error":"\([^"]*\)".*/\1/; s/^Error: //')
            say "round $round n$idx $e FAIL ($why)"
            eval "fail_$idx=\$((fail_$idx + 1))"
        fi
    done
    l=$(leader)
    if [ "$l" != "$lead" ]; then
        say "leader: ${l:-none reachable} (was: ${lead:-none})"
        lead=$l
    fi
    sleep "$INTERVAL"
done

idx=0
for e in $EPS; do
    idx=$((idx + 1))
    eval "summary=\"\$summary n$idx: \$ok_$idx ok \$fail_$idx failed;\""
done
say "done after $round rounds:$summary leader: ${lead:-none}"
[ "$ok_total" -gt 0 ] || { say "FAIL: no write succeeded"; exit 1; }
exit 0
