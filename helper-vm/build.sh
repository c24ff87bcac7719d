#!/usr/bin/env bash
# Builds the detvisor helper VM (L1) assets: a Debian kernel and a busybox initramfs that
# loads KVM. See README.md next to this script.
#
# Output: ${DETVISOR_CACHE:-~/.cache/detvisor}/helper-vm/<key>/{vmlinuz,vmlinux,initramfs.cpio.gz,build-info}
# plus the symlink helper-vm/default -> <key>. The asset directory is the only thing printed on
# stdout; progress and apt output go to stderr. When the assets for the current key exist already
# this is a no-op apart from refreshing the `default` link.
#
# Environment:
#   DETVISOR_CACHE               cache root (default ~/.cache/detvisor)
#   DETVISOR_HELPER_KERNEL_PKG   kernel package to use (default: what linux-image-amd64 depends on)
set -euo pipefail
trap 'echo "helper-vm/build.sh: error: command failed at line $LINENO" >&2' ERR

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
script="$here/build.sh"
init="$here/init"
cache_root="${DETVISOR_CACHE:-${HOME:-/tmp}/.cache/detvisor}/helper-vm"
# Module roots; their dependencies (modinfo -F depends) are added and loaded first.
root_modules=(irqbypass ccp kvm kvm_amd)
# Loaded only when the launcher shares host directories (virtio-9p over PCI). Debian's 6.1
# kernel has CONFIG_PCI=y but CONFIG_VIRTIO=m, CONFIG_VIRTIO_PCI=m, CONFIG_NET_9P=m,
# CONFIG_NET_9P_VIRTIO=m, CONFIG_9P_FS=m, CONFIG_NETFS_SUPPORT=m, CONFIG_FSCACHE=m: the closure
# of these roots is virtio, virtio_ring, virtio_pci_{legacy,modern}_dev, virtio_pci, 9pnet,
# 9pnet_virtio, netfs, fscache, 9p.
share_modules=(virtio_pci 9pnet_virtio 9p)
# Loaded only when the launcher opens the channel (a virtio-serial port over PCI; Debian's 6.1
# kernel has CONFIG_VIRTIO_CONSOLE=m). Each group's closure is computed on top of the KVM
# modules alone, so that either group loads without the other.
channel_modules=(virtio_pci virtio_console)
# What these assets support; the launcher (the helper-vm crate, src/assets.rs) rebuilds assets
# that lack a feature it needs (`features` line of build-info).
features="kvm 9p workdir channel"
# Fixed timestamp for every file of the initramfs (reproducible output).
epoch=0

log() { echo "helper-vm/build.sh: $*" >&2; }
die() {
	log "error: $*"
	exit 1
}

apt_updated=
apt_update() {
	if [ -z "$apt_updated" ]; then
		log "apt-get update"
		apt-get update >&2 || die "apt-get update failed"
		apt_updated=1
	fi
}

apt_install() {
	[ "$(id -u)" = 0 ] || die "missing package(s) $*: install them (apt-get install $*) or run as root"
	log "installing $*"
	export DEBIAN_FRONTEND=noninteractive
	if ! apt-get install -y --no-install-recommends "$@" >&2; then
		apt_update
		apt-get install -y --no-install-recommends "$@" >&2 || die "apt-get install $* failed"
	fi
}

pkg_version() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || true; }
pkg_installed() { [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null || true)" = "install ok installed" ]; }

# --- host tools --------------------------------------------------------------------------------
missing=()
command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
pkg_installed busybox-static || missing+=(busybox-static)
command -v cpio >/dev/null || missing+=(cpio)
command -v modinfo >/dev/null || missing+=(kmod)
command -v xz >/dev/null || missing+=(xz-utils)
command -v sha256sum >/dev/null || missing+=(coreutils)
if [ ${#missing[@]} -gt 0 ]; then
	apt_install "${missing[@]}"
fi
busybox=/bin/busybox
[ -x "$busybox" ] || die "$busybox (from busybox-static) not found"

# --- which kernel ------------------------------------------------------------------------------
# apt-cache takes ~1 s per call here (Debian's docker images disable APT's pkgcache), too slow
# for the no-op path, so the resolution is remembered together with a fingerprint of the apt
# lists and sources: any `apt-get update` or sources change invalidates it.
resolve_kernel_pkg() {
	apt-cache depends linux-image-amd64 2>/dev/null |
		awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9]/ { print $2; exit }' || true
}
candidate() { apt-cache policy "$1" 2>/dev/null | awk '$1 == "Candidate:" { print $2; exit }' || true; }
apt_fingerprint() {
	{
		echo "override=${DETVISOR_HELPER_KERNEL_PKG:-}"
		stat -c '%n %s %Y' /var/lib/apt/lists/* /etc/apt/sources.list /etc/apt/sources.list.d/* \
			/etc/apt/preferences /etc/apt/preferences.d/* 2>/dev/null || true
	} | sha256sum | cut -c1-16
}
resolution="$cache_root/.kernel-resolution"
fp=$(apt_fingerprint)
kpkg=
kver=
if [ -f "$resolution" ]; then
	read -r rfp rpkg rver <"$resolution" || true
	if [ "${rfp:-}" = "$fp" ] && [ -n "${rpkg:-}" ] && [ -n "${rver:-}" ]; then
		kpkg=$rpkg
		kver=$rver
	fi
fi
if [ -z "$kpkg" ]; then
	kpkg="${DETVISOR_HELPER_KERNEL_PKG:-}"
	if [ -z "$kpkg" ]; then
		kpkg=$(resolve_kernel_pkg)
		if [ -z "$kpkg" ]; then
			apt_update
			kpkg=$(resolve_kernel_pkg)
		fi
		[ -n "$kpkg" ] || die "cannot resolve the kernel package: apt-cache depends linux-image-amd64 names no linux-image-<abi>-amd64"
	fi
	kver=$(candidate "$kpkg")
	if [ -z "$kver" ] || [ "$kver" = "(none)" ]; then
		apt_update
		kver=$(candidate "$kpkg")
	fi
	if [ -z "$kver" ] || [ "$kver" = "(none)" ]; then
		die "no installable version of $kpkg (apt-cache policy $kpkg)"
	fi
	fp=$(apt_fingerprint) # apt_update may have changed the lists
	mkdir -p "$cache_root"
	printf '%s %s %s\n' "$fp" "$kpkg" "$kver" >"$resolution.$$"
	mv -f "$resolution.$$" "$resolution"
fi
bbver=$(pkg_version busybox-static)

key=$({
	cat "$script" "$init"
	printf 'kernel %s %s\nbusybox-static %s\n' "$kpkg" "$kver" "$bbver"
} | sha256sum | cut -c1-16)
out="$cache_root/$key"

set_default() {
	local tmp_link="$cache_root/.default.$$"
	ln -sfn "$key" "$tmp_link"
	mv -Tf "$tmp_link" "$cache_root/default"
}

if [ -f "$out/vmlinuz" ] && [ -f "$out/initramfs.cpio.gz" ]; then
	set_default
	echo "$out"
	exit 0
fi

# --- build -------------------------------------------------------------------------------------
mkdir -p "$cache_root"
tmp=$(mktemp -d "$cache_root/.build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
log "building $out ($kpkg $kver, busybox-static $bbver)"

mkdir "$tmp/deb"
apt_opts=()
[ "$(id -u)" = 0 ] && apt_opts=(-o APT::Sandbox::User=root)
(cd "$tmp/deb" && apt-get "${apt_opts[@]}" download "$kpkg=$kver" >&2) ||
	die "apt-get download $kpkg=$kver failed"
deb=$(echo "$tmp"/deb/*.deb)
[ -f "$deb" ] || die "apt-get download produced no .deb"
log "extracting $(basename "$deb")"
dpkg-deb -x "$deb" "$tmp/pkg"
rm -f "$deb"

vmlinuz=$(find "$tmp/pkg/boot" -maxdepth 1 -name 'vmlinuz-*' -type f | head -n 1)
[ -n "$vmlinuz" ] || die "no /boot/vmlinuz-* in $kpkg"
moddir=
for d in "$tmp"/pkg/lib/modules/* "$tmp"/pkg/usr/lib/modules/*; do
	[ -d "$d/kernel" ] && moddir=$d && break
done
[ -n "$moddir" ] || die "no lib/modules/<version> in $kpkg"

# Module name -> file (names use '_' and '-' interchangeably), decompressed into $tmp/mods.
mkdir "$tmp/mods"
declare -A seen=()
order=()
find_module() {
	local a=${1//_/-} b=${1//-/_}
	find "$moddir" -type f \( -name "$a.ko" -o -name "$a.ko.*" -o -name "$b.ko" -o -name "$b.ko.*" \) | LC_ALL=C sort | head -n 1
}
builtin() { # is module $1 built into the kernel?
	local a=${1//_/-} b=${1//-/_}
	grep -q -E "/($a|$b)\.ko\$" "$moddir/modules.builtin" 2>/dev/null
}
visit() {
	local name=${1//-/_} path base dst deps d
	[ -z "${seen[$name]:-}" ] || return 0
	seen[$name]=1
	builtin "$name" && return 0
	path=$(find_module "$name")
	[ -n "$path" ] || die "module $name not found in $kpkg"
	base=$(basename "$path")
	base=${base%%.ko*}
	dst="$tmp/mods/$base.ko"
	case "$path" in
	*.ko) cp "$path" "$dst" ;;
	*.ko.xz) xz -dc "$path" >"$dst" ;;
	*.ko.zst) zstd -qdc "$path" >"$dst" ;;
	*.ko.gz) gzip -dc "$path" >"$dst" ;;
	*) die "unknown module compression: $path" ;;
	esac
	deps=$(modinfo -F depends "$dst")
	for d in ${deps//,/ }; do
		visit "$d"
	done
	order+=("$base")
}
for m in "${root_modules[@]}"; do
	visit "$m"
done
kvm_order=("${order[@]}")
kvm_seen=("${!seen[@]}")
group_closure() { # the closure of the given roots beyond the KVM modules, into `order`
	seen=()
	for k in "${kvm_seen[@]}"; do
		seen[$k]=1
	done
	order=()
	for m in "$@"; do
		visit "$m"
	done
}
group_closure "${share_modules[@]}"
share_order=("${order[@]}")
group_closure "${channel_modules[@]}"
channel_order=("${order[@]}")
order=("${kvm_order[@]}" "${share_order[@]}" "${channel_order[@]}")
log "modules: ${kvm_order[*]}; for shared directories: ${share_order[*]}; for the channel: ${channel_order[*]}"

# The initramfs tree.
root="$tmp/root"
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,dev,proc,sys,tmp,root,etc/helper-vm,lib/modules,payload/files}
cp "$busybox" "$root/bin/busybox"
"$busybox" --list-full | while read -r applet; do
	case "$applet" in
	*/*) [ -e "$root/$applet" ] || ln -s /bin/busybox "$root/$applet" ;;
	esac # skips the bare "linuxrc"
done
cp "$init" "$root/init"
for m in "${order[@]}"; do
	cp "$tmp/mods/$m.ko" "$root/lib/modules/$m.ko"
done
printf '%s\n' "${kvm_order[@]}" >"$root/etc/helper-vm/modules"
printf '%s\n' "${share_order[@]}" >"$root/etc/helper-vm/modules-9p"
printf '%s\n' "${channel_order[@]}" >"$root/etc/helper-vm/modules-channel"
# The kernel opens /dev/console for init before devtmpfs is mounted. Its built-in initramfs has
# the node too; make it anyway when we can (root).
mknod -m 600 "$root/dev/console" c 5 1 2>/dev/null || log "note: cannot mknod dev/console (not root); relying on the kernel's built-in initramfs"

find "$root" -type d -exec chmod 0755 {} +
find "$root" -type f -exec chmod 0644 {} +
chmod 0755 "$root/init" "$root/bin/busybox"
chmod 1777 "$root/tmp"
find "$root" -exec touch -h -d "@$epoch" {} +

mkdir "$tmp/out"
(cd "$root" && find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort |
	cpio --quiet -o -H newc -R 0:0 --reproducible) | gzip -n -9 >"$tmp/out/initramfs.cpio.gz"
cp "$vmlinuz" "$tmp/out/vmlinuz"
# Under TCG, decompressing the 8 MB xz bzImage takes ~7 s of boot time. QEMU boots an ELF
# vmlinux with a PVH entry note (CONFIG_PVH) directly, so also keep the decompressed kernel that
# the bzImage carries; the launcher prefers it. Skipped (bzImage only) when not applicable.
xz_at=$(LC_ALL=C grep -abo -m1 -P '\xfd7zXZ\x00' "$vmlinuz" | head -n 1 | cut -d: -f1 || true)
if [ -n "$xz_at" ] && { tail -c +$((xz_at + 1)) "$vmlinuz" || true; } | xz -dc --single-stream >"$tmp/vmlinux" 2>/dev/null &&
	[ "$(head -c 4 "$tmp/vmlinux" | od -An -c | tr -d ' ')" = '177ELF' ] &&
	LC_ALL=C grep -q -a -P '\x04\x00\x00\x00[\x04\x08]\x00\x00\x00\x12\x00\x00\x00Xen\x00' "$tmp/vmlinux"; then
	mv "$tmp/vmlinux" "$tmp/out/vmlinux"
else
	log "note: no PVH-bootable vmlinux inside $(basename "$vmlinuz"); the helper VM boots the bzImage (slower)"
fi
{
	echo "key $key"
	echo "kernel $kpkg $kver $(basename "$vmlinuz")"
	[ -f "$tmp/out/vmlinux" ] && echo "vmlinux extracted from $(basename "$vmlinuz") (PVH boot)"
	echo "busybox-static $bbver"
	echo "modules ${kvm_order[*]}"
	echo "modules-9p ${share_order[*]}"
	echo "modules-channel ${channel_order[*]}"
	echo "features $features"
} >"$tmp/out/build-info"
chmod 0644 "$tmp/out"/*
chmod 0755 "$tmp/out"

if ! mv -T "$tmp/out" "$out" 2>/dev/null; then
	# Lost a race with a concurrent build of the same key: keep the winner's copy.
	if [ ! -f "$out/vmlinuz" ] || [ ! -f "$out/initramfs.cpio.gz" ]; then
		die "cannot move the assets to $out"
	fi
fi
set_default
log "done"
echo "$out"
