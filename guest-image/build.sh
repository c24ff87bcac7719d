#!/usr/bin/env bash
# Build the default detvisor guest image (kernel + initramfs) and cache it
# outside the clone:
#
#   ${DETVISOR_CACHE:-~/.cache/detvisor}/guest-image/<key>/
#       vmlinux             uncompressed ELF, what detvisor boots
#       bzImage             same kernel, for QEMU / debugging
#       initramfs.cpio.gz   busybox + /init (gzip, reproducible)
#       config              the full kernel .config that was used
#       kernel.release      `uname -r` of the kernel
#   ${DETVISOR_CACHE:-~/.cache/detvisor}/guest-image/default -> <key>
#
# <key> = first 16 hex digits of a sha256 over kernel.config, patches/*,
# init, this script and the installed versions of linux-source-6.1 and
# busybox-static.  Prints the directory on stdout (and nothing else);
# progress goes to stderr.  If the entry exists it only prints it.
#
# Usage: guest-image/build.sh                 build (or reuse) and print dir
#        guest-image/build.sh --key           print the key only
#        guest-image/build.sh --initramfs OUT build only the initramfs to OUT
set -euo pipefail
export LC_ALL=C

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE_ROOT=${DETVISOR_CACHE:-$HOME/.cache/detvisor}
GI_CACHE=$CACHE_ROOT/guest-image
KERNEL_SRC_PKG=linux-source-6.1
KERNEL_TARBALL=/usr/src/linux-source-6.1.tar.xz
BUSYBOX=/bin/busybox
PKGS=(linux-source-6.1 busybox-static build-essential flex bison bc libelf-dev
      libssl-dev cpio xz-utils kmod qemu-system-x86)

log() { printf 'guest-image: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# --- packages: install only what is missing --------------------------------
ensure_packages() {
    local missing=() p
    for p in "${PKGS[@]}"; do
        if [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null)" != installed ]; then
            missing+=("$p")
        fi
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    log "installing missing packages: ${missing[*]}"
    local sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    "${sudo[@]}" apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq \
        --no-install-recommends "${missing[@]}" >&2
}

pkg_version() { dpkg-query -W -f='${Version}' "$1"; }

# --- cache key ---------------------------------------------------------------
compute_key() {
    (
        cd "$HERE"
        sha256sum kernel.config init build.sh
        # sorted, so the patch order is part of the key too
        for p in patches/*.patch; do sha256sum "$p"; done
        echo "$KERNEL_SRC_PKG $(pkg_version "$KERNEL_SRC_PKG")"
        echo "busybox-static $(pkg_version busybox-static)"
    ) | sha256sum | cut -c1-16
}

entry_complete() {
    local d=$1 f
    for f in vmlinux bzImage initramfs.cpio.gz; do
        [ -s "$d/$f" ] || return 1
    done
}

point_default() {
    local key=$1
    if [ "$(readlink "$GI_CACHE/default" 2>/dev/null || true)" != "$key" ]; then
        ln -sfn "$key" "$GI_CACHE/.default.$$"
        mv -fT "$GI_CACHE/.default.$$" "$GI_CACHE/default"
    fi
}

# --- initramfs ---------------------------------------------------------------
# make_initramfs OUTFILE: deterministic newc cpio (sorted, uid/gid 0, all
# mtimes 0, renumbered inodes) compressed with gzip -n -9, zero-padded to a
# multiple of 4 bytes so detvisor can append an uncompressed cpio directly.
make_initramfs() (
    out=$1
    root=$(mktemp -d "${TMPDIR:-/tmp}/detvisor-initramfs.XXXXXX")
    # shellcheck disable=SC2064
    trap "rm -rf '$root'" EXIT
    umask 022
    mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,dev,proc,sys,tmp,run,root,etc,detvisor}
    cp -L "$BUSYBOX" "$root/bin/busybox"
    chmod 0755 "$root/bin/busybox"
    for applet in $("$BUSYBOX" --list-full); do
        [ "$applet" = bin/busybox ] && continue
        mkdir -p "$root/$(dirname "$applet")"
        ln -sfn /bin/busybox "$root/$applet"
    done
    install -m 0755 "$HERE/init" "$root/init"
    printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
    printf 'root:x:0:\ntty:x:5:\n' >"$root/etc/group"
    printf '127.0.0.1\tlocalhost detvisor\n' >"$root/etc/hosts"
    chmod 0644 "$root/etc/passwd" "$root/etc/group" "$root/etc/hosts"
    chmod 1777 "$root/tmp"
    chmod 0700 "$root/root"
    find "$root" -exec touch -h -d @0 {} +
    (
        cd "$root"
        find . -mindepth 1 -printf '%P\n' | sort |
            cpio -o -H newc --reproducible -R 0:0 --quiet
    ) | gzip -n -9 >"$out"
    # Zero-pad to a multiple of 4 bytes: the kernel only accepts an
    # uncompressed cpio appended after a compressed one at a 4-aligned
    # offset (init/initramfs.c); gzip and the kernel skip trailing zeros.
    size=$(stat -c %s "$out")
    truncate -s $(((size + 3) / 4 * 4)) "$out"
)

verify_config() {
    # Every line of the fragment must have survived allnoconfig.
    local frag=$1 cfg=$2 bad=0 line sym
    while IFS= read -r line; do
        if [[ $line =~ ^#\ (CONFIG_[A-Za-z0-9_]+)\ is\ not\ set$ ]]; then
            sym=${BASH_REMATCH[1]}
            if grep -q "^$sym=" "$cfg"; then
                log "config: $sym should be off, got: $(grep "^$sym=" "$cfg")"
                bad=1
            fi
        elif [[ $line =~ ^(CONFIG_[A-Za-z0-9_]+)= ]]; then
            sym=${BASH_REMATCH[1]}
            if ! grep -qxF -- "$line" "$cfg"; then
                log "config: wanted '$line', got: '$(grep -E "^$sym=|^# $sym is not set" "$cfg" || echo absent)'"
                bad=1
            fi
        fi
    done <"$frag"
    [ $bad -eq 0 ] || die "kernel config check failed (missing dependency in kernel.config?)"
}

build_entry() {
    local key=$1 dest=$2 tmp src out t0 t1 jobs
    t0=$(date +%s)
    jobs=$(nproc)
    # Remove leftovers of interrupted builds (we hold the lock).
    rm -rf "$GI_CACHE"/.tmp.*
    tmp=$(mktemp -d "$GI_CACHE/.tmp.$key.XXXXXX")
    # shellcheck disable=SC2064
    trap "rm -rf '$tmp'" EXIT
    src=$tmp/src
    out=$tmp/out
    mkdir -p "$src" "$out"

    log "extracting $KERNEL_TARBALL"
    tar -xf "$KERNEL_TARBALL" -C "$src" --strip-components=1
    for p in "$HERE"/patches/*.patch; do
        log "applying $(basename "$p")"
        patch -d "$src" -p1 -s --forward --no-backup-if-mismatch <"$p"
    done

    # Fixed identity so `uname -a` / /proc/version do not depend on the
    # build machine or time.
    export KBUILD_BUILD_TIMESTAMP='Thu Jan  1 00:00:00 UTC 1970'
    export KBUILD_BUILD_USER=detvisor KBUILD_BUILD_HOST=detvisor
    export KBUILD_BUILD_VERSION=1
    export SOURCE_DATE_EPOCH=0

    log "configuring (allnoconfig + kernel.config)"
    make -C "$src" -s allnoconfig KCONFIG_ALLCONFIG="$HERE/kernel.config" >&2
    verify_config "$HERE/kernel.config" "$src/.config"

    log "building kernel with make -j$jobs (log: $tmp/build.log)"
    if ! nice -n 10 make -C "$src" -j"$jobs" vmlinux bzImage >"$tmp/build.log" 2>&1; then
        tail -n 40 "$tmp/build.log" >&2
        die "kernel build failed"
    fi
    # The config may not change during the build (e.g. a silent olddefconfig).
    verify_config "$HERE/kernel.config" "$src/.config"
    cp "$src/vmlinux" "$out/vmlinux"
    cp "$src/arch/x86/boot/bzImage" "$out/bzImage"
    cp "$src/.config" "$out/config"
    make -C "$src" -s kernelrelease >"$out/kernel.release"

    log "building initramfs (twice, must be byte-identical)"
    make_initramfs "$out/initramfs.cpio.gz"
    make_initramfs "$tmp/initramfs.check.cpio.gz"
    local a b
    a=$(sha256sum <"$out/initramfs.cpio.gz" | cut -d' ' -f1)
    b=$(sha256sum <"$tmp/initramfs.check.cpio.gz" | cut -d' ' -f1)
    [ "$a" = "$b" ] || die "initramfs is not reproducible ($a != $b)"

    chmod 0644 "$out"/*
    chmod 0755 "$out"
    # Atomic publish: the entry appears complete or not at all.
    mv -T "$out" "$dest"
    rm -rf "$tmp"
    trap - EXIT
    t1=$(date +%s)
    log "built $(cat "$dest/kernel.release") in $((t1 - t0)) s:" \
        "vmlinux $(stat -c %s "$dest/vmlinux") B," \
        "bzImage $(stat -c %s "$dest/bzImage") B," \
        "initramfs $(stat -c %s "$dest/initramfs.cpio.gz") B (sha256 $a)"
}

main() {
    case "${1:-}" in
    --initramfs)
        [ $# -eq 2 ] || die "usage: $0 --initramfs OUTFILE"
        ensure_packages
        make_initramfs "$2"
        return
        ;;
    --key)
        ensure_packages
        compute_key
        return
        ;;
    "") ;;
    *) die "usage: $0 [--key | --initramfs OUTFILE]" ;;
    esac

    ensure_packages
    local key dest
    key=$(compute_key)
    dest=$GI_CACHE/$key
    mkdir -p "$GI_CACHE"
    if ! entry_complete "$dest"; then
        # One builder at a time; re-check once we hold the lock.
        exec 9>"$GI_CACHE/.lock"
        flock -n 9 || { log "waiting for another build.sh"; flock 9; }
        if ! entry_complete "$dest"; then
            rm -rf "$dest"  # incomplete entry from an older script version
            build_entry "$key" "$dest"
        fi
        exec 9>&-
    fi
    point_default "$key"
    printf '%s\n' "$dest"
}

main "$@"
