#!/usr/bin/env bash
# Boots the default guest image under QEMU TCG with tests/timens_realtime.c
# (built static with gcc) as the guest's command: checks patches/0003 (a
# time namespace's CLOCK_REALTIME offset and rate, changeable at run time:
# every realtime reader, absolute deadlines, monotonic never back). Exits 0
# when the program reports success.
#
# Usage: guest-image/test-timens.sh [IMAGE_DIR]    (default: build.sh's)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dir=${1:-$("$HERE/build.sh")}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/detvisor-timens.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/root/bin" "$tmp/root/detvisor"
gcc -static -O2 -pthread -o "$tmp/root/bin/timens_realtime" "$HERE/tests/timens_realtime.c"
printf "'/bin/timens_realtime'\n" >"$tmp/root/detvisor/cmd"
find "$tmp/root" -exec touch -h -d @0 {} +
(cd "$tmp/root" && printf 'bin\nbin/timens_realtime\ndetvisor\ndetvisor/cmd\n' |
    cpio -o -H newc --reproducible -R 0:0 --quiet) >"$tmp/cmd.cpio"
cat "$dir/initramfs.cpio.gz" "$tmp/cmd.cpio" >"$tmp/initrd"

timeout 300 qemu-system-x86_64 -accel tcg -cpu qemu64,-tsc -m 512 -nographic -no-reboot \
    -kernel "$dir/bzImage" -initrd "$tmp/initrd" \
    -append 'console=ttyS0 reboot=t panic=-1 nokaslr random.trust_cpu=off lpj=1000000 quiet' \
    </dev/null | tr -d '\r' >"$tmp/console.log" || true
grep -aE 'start: |step|waited|rate|FAIL|namespace|timens_realtime:' "$tmp/console.log" | sed 's/^.*\(start: \)/\1/'
if grep -q '^timens_realtime: OK$' "$tmp/console.log"; then
    echo "test-timens: OK" >&2
else
    echo "test-timens: FAIL (console: $tmp/console.log)" >&2
    trap - EXIT
    exit 1
fi
