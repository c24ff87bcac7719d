#!/usr/bin/env bash
# Build a reproducible OCI image layout for the 3-node etcd example from
# Debian packages (nothing compiled here):
#
#   layer 1  Debian: etcd-server, etcd-client (etcd 3.4.23, Go, dynamically
#            linked), from libc6 only the loader and libc.so.6 (all the
#            binaries need: see README.md), busybox-static as /bin/busybox
#            plus applet symlinks, a few /etc files and empty mount points
#   layer 2  ours: the workload scripts smoke.sh and partition.sh beside
#            this file, as /usr/local/bin/etcd-smoke and etcd-partition
#
# Usage: examples/etcd/build-oci.sh [OUT_DIR]
#   OUT_DIR default: ${DETVISOR_CACHE:-$HOME/.cache/detvisor}/examples/etcd-oci
#   The tag is `latest`: detvisor image build --oci OUT_DIR:latest --out etcd.img
#
# The result is reproducible: sorted tar entries, mtime 0, uid/gid 0, ustar
# format, `gzip -n -9`, JSON with a fixed key order and no whitespace, so two
# builds from the same package versions give the same digests.  OUT_DIR/stamp
# records the package versions (with their archive sha256) and the sha256 of
# this script and the workload scripts; if it matches, nothing is rebuilt.
# Prints OUT_DIR on stdout; progress goes to stderr.
set -euo pipefail
export LC_ALL=C TZ=UTC
umask 022

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
OUT=${1:-${DETVISOR_CACHE:-$HOME/.cache/detvisor}/examples/etcd-oci}
PKGS=(etcd-server etcd-client libc6 busybox-static)
# libc6 files the binaries need (readelf -d: NEEDED libc.so.6 only;
# PT_INTERP /lib64/ld-linux-x86-64.so.2).
LIBC_FILES=(
    lib64/ld-linux-x86-64.so.2
    lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
    lib/x86_64-linux-gnu/libc.so.6
)
# Busybox applets that must exist (the rest of `busybox --list-full` too).
REQUIRED_APPLETS=(sh cat echo sleep grep seq test printf mkdir ls date true false
                  awk sed head tail tr cut wc timeout)

log() { printf 'etcd-oci: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

for tool in apt-get dpkg-deb tar gzip sha256sum find sort; do
    command -v "$tool" >/dev/null || die "missing tool: $tool"
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/etcd-oci.XXXXXX")
# shellcheck disable=SC2064
trap "rm -rf '$WORK'" EXIT
# apt-get download drops privileges to _apt when it can: let it write here.
chmod 0755 "$WORK"
mkdir -p "$WORK/debs"
if id _apt >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
    chown _apt "$WORK/debs" 2>/dev/null || true
fi

# --- stamp: exact package versions (without downloading) + our inputs --------
# `--print-uris` prints 'URI' FILE SIZE SHA256:... for each package.
uris=$(cd "$WORK/debs" && apt-get download --print-uris "${PKGS[@]}" 2>/dev/null) ||
    die "apt-get download --print-uris failed (run apt-get update?)"
[ "$(printf '%s\n' "$uris" | grep -c .)" -eq ${#PKGS[@]} ] ||
    die "expected ${#PKGS[@]} packages from apt, got: $uris"
stamp=$(
    printf '%s\n' "$uris" | awk '{print $2, $4}' | sort
    cd "$HERE" && sha256sum build-oci.sh smoke.sh partition.sh
)
if [ -f "$OUT/stamp" ] && [ "$(cat "$OUT/stamp")" = "$stamp" ] &&
    [ -f "$OUT/index.json" ] && [ -f "$OUT/oci-layout" ]; then
    log "up to date: $OUT"
    printf '%s\n' "$OUT"
    exit 0
fi

# --- download and unpack -------------------------------------------------------
log "downloading ${PKGS[*]}"
(cd "$WORK/debs" && apt-get download -q "${PKGS[@]}" >&2) || die "apt-get download failed"
deb() { local f; f=$(ls "$WORK/debs/$1"_*.deb) && printf '%s\n' "$f"; }
for p in "${PKGS[@]}"; do
    mkdir -p "$WORK/pkg/$p"
    dpkg-deb -x "$(deb "$p")" "$WORK/pkg/$p"
done

# --- layer 1 tree: Debian ----------------------------------------------------
R1=$WORK/root1
mkdir -p "$R1"/{bin,sbin,usr/bin,usr/sbin,usr/local/bin,etc,dev,proc,sys,run,tmp,root,var/lib/etcd}
install -m 0755 "$WORK/pkg/etcd-server/usr/bin/etcd" "$R1/usr/bin/etcd"
install -m 0755 "$WORK/pkg/etcd-client/usr/bin/etcdctl" "$R1/usr/bin/etcdctl"
for f in "${LIBC_FILES[@]}"; do
    src=$WORK/pkg/libc6/$f
    [ -e "$src" ] || [ -L "$src" ] || die "libc6 has no $f"
    mkdir -p "$R1/$(dirname "$f")"
    cp -a "$src" "$R1/$f"
done
# Everything the binaries load must be in the image: check NEEDED + interp.
if command -v readelf >/dev/null; then
    for b in "$R1/usr/bin/etcd" "$R1/usr/bin/etcdctl"; do
        interp=$(readelf -l "$b" | sed -n 's/.*interpreter: \(.*\)\]/\1/p')
        [ -z "$interp" ] || [ -e "$R1$interp" ] || die "$b: interpreter $interp missing"
        for lib in $(readelf -d "$b" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p'); do
            [ -e "$R1/lib/x86_64-linux-gnu/$lib" ] || die "$b needs $lib, not in the image"
        done
    done
fi
install -m 0755 "$WORK/pkg/busybox-static/bin/busybox" "$R1/bin/busybox"
applets=$("$R1/bin/busybox" --list-full)
for a in $applets; do
    [ "$a" = bin/busybox ] && continue
    mkdir -p "$R1/$(dirname "$a")"
    [ -e "$R1/$a" ] || ln -s /bin/busybox "$R1/$a"
done
for a in "${REQUIRED_APPLETS[@]}"; do
    [ -L "$R1/bin/$a" ] || [ -L "$R1/usr/bin/$a" ] || [ -L "$R1/sbin/$a" ] ||
        [ -L "$R1/usr/sbin/$a" ] || die "busybox has no applet $a"
done
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$R1/etc/passwd"
printf 'root:x:0:\n' >"$R1/etc/group"
printf '127.0.0.1\tlocalhost\n::1\tlocalhost\n' >"$R1/etc/hosts"
printf 'hosts: files\n' >"$R1/etc/nsswitch.conf"
# Record where the files came from.
for p in "${PKGS[@]}"; do
    printf '%s %s\n' "$p" "$(dpkg-deb -f "$(deb "$p")" Version)"
done >"$R1/etc/detvisor-etcd-packages"
chmod 1777 "$R1/tmp"
chmod 0700 "$R1/root" "$R1/var/lib/etcd"

# --- layer 2 tree: our workload scripts ---------------------------------------
R2=$WORK/root2
mkdir -p "$R2/usr/local/bin"
install -m 0755 "$HERE/smoke.sh" "$R2/usr/local/bin/etcd-smoke"
install -m 0755 "$HERE/partition.sh" "$R2/usr/local/bin/etcd-partition"

# --- blobs -----------------------------------------------------------------
STAGE=$WORK/oci
mkdir -p "$STAGE/blobs/sha256"

# put_blob FILE: moves FILE into blobs/sha256, prints its digest hex.
put_blob() {
    local h
    h=$(sha256sum <"$1" | cut -d' ' -f1)
    mv "$1" "$STAGE/blobs/sha256/$h"
    chmod 0644 "$STAGE/blobs/sha256/$h"
    printf '%s\n' "$h"
}
size_of() { stat -c %s "$STAGE/blobs/sha256/$1"; }

# make_layer DIR: deterministic ustar of DIR, gzipped; sets LAYER_HEX, DIFF_HEX.
make_layer() {
    local dir=$1 tarf=$WORK/layer.tar
    find "$dir" -exec touch -h -d @0 {} +
    (cd "$dir" && find . -mindepth 1 -printf '%P\n' | sort) >"$WORK/list"
    tar -C "$dir" --format=ustar --no-recursion --numeric-owner --owner=0 --group=0 \
        --mtime=@0 -cf "$tarf" -T "$WORK/list"
    DIFF_HEX=$(sha256sum <"$tarf" | cut -d' ' -f1)
    gzip -n -9 <"$tarf" >"$WORK/layer.tar.gz"
    rm -f "$tarf"
    LAYER_HEX=$(put_blob "$WORK/layer.tar.gz")
}

make_layer "$R1"
L1=$LAYER_HEX D1=$DIFF_HEX
make_layer "$R2"
L2=$LAYER_HEX D2=$DIFF_HEX

LAYER_MT=application/vnd.oci.image.layer.v1.tar+gzip
PATH_ENV=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# Keys in lexicographic order, no whitespace: the same inputs give the same bytes.
printf '{"architecture":"amd64","config":{"Cmd":["etcd","--data-dir","/var/lib/etcd/default"],"Env":["PATH=%s","ETCDCTL_API=3"],"WorkingDir":"/"},"created":"1970-01-01T00:00:00Z","history":[{"created":"1970-01-01T00:00:00Z","created_by":"examples/etcd/build-oci.sh: Debian %s"},{"created":"1970-01-01T00:00:00Z","created_by":"examples/etcd/build-oci.sh: workload scripts"}],"os":"linux","rootfs":{"diff_ids":["sha256:%s","sha256:%s"],"type":"layers"}}' \
    "$PATH_ENV" "${PKGS[*]}" "$D1" "$D2" >"$WORK/config.json"
CFG=$(put_blob "$WORK/config.json")

printf '{"config":{"digest":"sha256:%s","mediaType":"application/vnd.oci.image.config.v1+json","size":%s},"layers":[{"digest":"sha256:%s","mediaType":"%s","size":%s},{"digest":"sha256:%s","mediaType":"%s","size":%s}],"mediaType":"application/vnd.oci.image.manifest.v1+json","schemaVersion":2}' \
    "$CFG" "$(size_of "$CFG")" "$L1" "$LAYER_MT" "$(size_of "$L1")" \
    "$L2" "$LAYER_MT" "$(size_of "$L2")" >"$WORK/manifest.json"
MAN=$(put_blob "$WORK/manifest.json")

printf '{"manifests":[{"annotations":{"org.opencontainers.image.ref.name":"latest"},"digest":"sha256:%s","mediaType":"application/vnd.oci.image.manifest.v1+json","platform":{"architecture":"amd64","os":"linux"},"size":%s}],"mediaType":"application/vnd.oci.image.index.v1+json","schemaVersion":2}' \
    "$MAN" "$(size_of "$MAN")" >"$STAGE/index.json"
printf '{"imageLayoutVersion":"1.0.0"}' >"$STAGE/oci-layout"
printf '%s\n' "$stamp" >"$STAGE/stamp"
chmod 0644 "$STAGE/index.json" "$STAGE/oci-layout" "$STAGE/stamp"

# --- publish (replace OUT as a whole) -----------------------------------------
mkdir -p "$(dirname "$OUT")"
rm -rf "$OUT.old.$$"
[ -e "$OUT" ] && mv -T "$OUT" "$OUT.old.$$"
mv -T "$STAGE" "$OUT"
rm -rf "$OUT.old.$$"
log "built $OUT: manifest sha256:$MAN, layers sha256:$L1 ($(stat -c %s "$OUT/blobs/sha256/$L1") B) and sha256:$L2"
printf '%s\n' "$OUT"
