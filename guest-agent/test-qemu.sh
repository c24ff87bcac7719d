#!/usr/bin/env bash
# Smoke test of the agent as PID 1 of a real guest (QEMU TCG, no KVM):
# the default guest kernel, its initramfs plus an appended archive holding
# the static agent and two node root directories (/nodes/n1, /nodes/n2,
# static busybox), booted with rdinit=/detvisor-agent on QEMU's microvm
# machine (virtio-mmio, like detvisor): a virtio console (the guest's
# /dev/hvc0) on a unix socket, two virtio-net NICs on one QEMU hub, and
# isa-debugcon on port 0x610 to capture the status byte.
# examples/qemu_smoke.rs drives the scenario; the guest must then end by
# itself with status byte 3 (the workload's exit status).
# The CPU has no APIC (like detvisor's model): the 8259 then drives INTR
# directly; microvm's BIOS leaves the LAPIC's LINT0 masked otherwise.
#
#   agent/test-qemu.sh [-t SECS]
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/.."
secs=300
while getopts t: opt; do
	case $opt in
	t) secs=$OPTARG ;;
	*) exit 2 ;;
	esac
done

image=$(bash guest-image/build.sh)
agent=$(bash agent/build.sh)
cargo build -q -p guest-agent --example qemu_smoke
driver=target/debug/examples/qemu_smoke

tmp=$(mktemp -d "${TMPDIR:-/tmp}/detvisor-agent-qemu.XXXXXX")
qemu_pid=
cleanup() {
	[ -z "$qemu_pid" ] || kill "$qemu_pid" 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT

mkdir -p "$tmp/root"
cp "$agent" "$tmp/root/detvisor-agent"
for node in n1 n2; do
	mkdir -p "$tmp/root/nodes/$node/bin"
	cp /bin/busybox "$tmp/root/nodes/$node/bin/"
	for applet in $(/bin/busybox --list); do
		[ "$applet" = busybox ] || ln -s busybox "$tmp/root/nodes/$node/bin/$applet"
	done
done
# The base archive is zero-padded to 4 bytes, so plain concatenation works.
(cd "$tmp/root" && find . | sort | cpio -o -H newc -R 0:0 --quiet) >"$tmp/overlay.cpio"
cat "$image/initramfs.cpio.gz" "$tmp/overlay.cpio" >"$tmp/initrd"

timeout "$secs" qemu-system-x86_64 -M microvm,acpi=off,pit=on,pic=on,rtc=on \
	-accel tcg -cpu qemu64,-apic -m 512 -nographic -no-reboot \
	-kernel "$image/bzImage" -initrd "$tmp/initrd" \
	-append 'console=ttyS0 reboot=t panic=-1 nokaslr noapic nolapic random.trust_cpu=off lpj=1000000 rdinit=/detvisor-agent' \
	-chardev socket,id=ctl,path="$tmp/ctl.sock",server=on,wait=on \
	-device virtio-serial-device -device virtconsole,chardev=ctl \
	-netdev hubport,id=p1,hubid=0 -device virtio-net-device,netdev=p1 \
	-netdev hubport,id=p2,hubid=0 -device virtio-net-device,netdev=p2 \
	-chardev file,id=status,path="$tmp/status" \
	-device isa-debugcon,iobase=0x610,chardev=status \
	</dev/null >"$tmp/console.log" 2>&1 &
qemu_pid=$!

fail=0
if ! timeout "$secs" "$driver" "$tmp/ctl.sock"; then
	fail=1
	kill "$qemu_pid" 2>/dev/null || true
fi
qemu_rc=0
wait "$qemu_pid" || qemu_rc=$?
qemu_pid=
echo "== guest console (last lines)"
tr -d '\r' <"$tmp/console.log" | tail -n 15
got=$(od -An -v -tu1 "$tmp/status" 2>/dev/null | tr -s ' \n' ' ' | sed 's/^ //; s/ $//')
if [ "$qemu_rc" -ne 0 ]; then
	echo "test-qemu: FAIL: qemu exited with $qemu_rc (124 = timeout)" >&2
	fail=1
fi
if [ "$got" != 3 ]; then
	echo "test-qemu: FAIL: status bytes '$got', expected '3'" >&2
	fail=1
fi
[ $fail -eq 0 ] && echo "test-qemu: OK"
exit $fail
