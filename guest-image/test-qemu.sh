#!/usr/bin/env bash
# Smoke test of the guest image under QEMU TCG (no KVM needed).
#
#   guest-image/test-qemu.sh [-d IMAGE_DIR] [-c CPU] [-s EXPECTED_STATUS] [-t SECS] [CMD...]
#
# Appends an uncompressed newc cpio holding /detvisor/cmd (the shell-quoted
# CMD, default: uname -a) to initramfs.cpio.gz, boots bzImage, and checks
# that the guest (1) wrote exactly one byte, the command's exit status, to
# I/O port 0x610 (captured with QEMU's isa-debugcon device) and (2) QEMU
# exited by itself (init falls back to `reboot -f`, -no-reboot ends QEMU).
# QEMU's PC has a LAPIC/IO-APIC, unlike detvisor: this only proves that the
# kernel and /init work in general.  The console log is printed on stdout.
set -euo pipefail
export LC_ALL=C
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

dir= cpu=qemu64 expect=0 secs=180
while getopts d:c:s:t: opt; do
    case $opt in
    d) dir=$OPTARG ;;
    c) cpu=$OPTARG ;;
    s) expect=$OPTARG ;;
    t) secs=$OPTARG ;;
    *) exit 2 ;;
    esac
done
shift $((OPTIND - 1))
[ $# -gt 0 ] || set -- uname -a
[ -n "$dir" ] || dir=$("$HERE/build.sh")

tmp=$(mktemp -d "${TMPDIR:-/tmp}/detvisor-qemu.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# The command line, shell-quoted the way detvisor writes it: 'a' 'b' ...
mkdir -p "$tmp/root/detvisor"
for a in "$@"; do
    printf "'%s' " "$(printf %s "$a" | sed "s/'/'\\\\''/g")"
done | sed 's/ $//' >"$tmp/root/detvisor/cmd"
echo >>"$tmp/root/detvisor/cmd"
find "$tmp/root" -exec touch -h -d @0 {} +
(cd "$tmp/root" && printf 'detvisor\ndetvisor/cmd\n' |
    cpio -o -H newc --reproducible -R 0:0 --quiet) >"$tmp/cmd.cpio"
cat "$dir/initramfs.cpio.gz" "$tmp/cmd.cpio" >"$tmp/initrd"

rc=0
timeout "$secs" qemu-system-x86_64 -accel tcg -cpu "$cpu" -m 512 -nographic -no-reboot \
    -kernel "$dir/bzImage" -initrd "$tmp/initrd" \
    -chardev file,id=status,path="$tmp/status" \
    -device isa-debugcon,iobase=0x610,chardev=status \
    -append 'console=ttyS0 reboot=t panic=-1 nokaslr random.trust_cpu=off lpj=1000000' \
    </dev/null >"$tmp/console.log" 2>&1 || rc=$?
tr -d '\r' <"$tmp/console.log"

fail=0
if [ $rc -ne 0 ]; then
    echo "test-qemu: FAIL: qemu exited with $rc (124 = timeout)" >&2
    fail=1
fi
got=$(od -An -v -tu1 "$tmp/status" 2>/dev/null | tr -s ' \n' ' ' | sed 's/^ //; s/ $//')
if [ "$got" != "$expect" ]; then
    echo "test-qemu: FAIL: status port bytes [$got], expected exactly [$expect]" >&2
    fail=1
else
    echo "test-qemu: OK: status port got one byte [$got]; qemu exit code $rc" >&2
fi
exit $fail
