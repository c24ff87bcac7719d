#!/usr/bin/env bash
# Build the raft example's OCI image layout: raftkv (a key-value service on
# Debian's golang-github-hashicorp-raft-dev) and kvclient (the workload that
# records a history, for raftkv and for etcd), compiled with Debian's Go in
# GOPATH mode against Debian's packaged sources (/usr/share/gocode), static
# (CGO_ENABLED=0):
#
#   layer 1  Debian: busybox-static as /bin/busybox plus applet symlinks, a
#            few /etc files and empty mount points
#   layer 2  ours: /usr/local/bin/raftkv and /usr/local/bin/kvclient
#
# Usage: examples/raft/build.sh [--image FILE] [OUT_DIR]
#   OUT_DIR default: ${DETVISOR_CACHE:-$HOME/.cache/detvisor}/examples/raft-oci
#   --image FILE: then run `${DETVISOR:-detvisor} image build --oci OUT_DIR:latest
#                 --out FILE` (e.g. --image examples/raft/raft.img)
#
# Installs golang-go, golang-github-hashicorp-raft-dev, golang-golang-x-sys-dev
# and busybox-static with apt-get when missing. The result is reproducible
# (go build -trimpath with an empty build id; sorted ustar layers with mtime
# 0; fixed JSON). OUT_DIR/stamp records the package versions and the sha256 of
# this script and the Go sources; if it matches, nothing is rebuilt. The Go
# build cache is ${DETVISOR_CACHE:-$HOME/.cache/detvisor}/go-build.
# Prints OUT_DIR on stdout; progress goes to stderr.
set -euo pipefail
export LC_ALL=C TZ=UTC
umask 022

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
EXAMPLES=$(dirname "$HERE")
CACHE=${DETVISOR_CACHE:-$HOME/.cache/detvisor}
IMAGE=
if [ "${1:-}" = --image ]; then
    [ $# -ge 2 ] || { echo "raft-oci: --image needs a FILE" >&2; exit 2; }
    IMAGE=$2
    shift 2
fi
OUT=${1:-$CACHE/examples/raft-oci}
GO_PKGS=(golang-go golang-github-hashicorp-raft-dev golang-golang-x-sys-dev)
DEB_PKGS=(busybox-static)
REQUIRED_APPLETS=(sh cat echo sleep grep ls date true false)

log() { printf 'raft-oci: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# --- packages ------------------------------------------------------------------
missing=()
for p in "${GO_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 ||
        die "apt-get install ${missing[*]} failed (run apt-get update?)"
fi
for tool in go apt-get dpkg-deb tar gzip sha256sum find sort; do
    command -v "$tool" >/dev/null || die "missing tool: $tool"
done

WORK=$(mktemp -d "${TMPDIR:-/tmp}/raft-oci.XXXXXX")
# shellcheck disable=SC2064
trap "rm -rf '$WORK'" EXIT
chmod 0755 "$WORK"
mkdir -p "$WORK/debs"
if id _apt >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
    chown _apt "$WORK/debs" 2>/dev/null || true
fi

# --- stamp ---------------------------------------------------------------------
uris=$(cd "$WORK/debs" && apt-get download --print-uris "${DEB_PKGS[@]}" 2>/dev/null) ||
    die "apt-get download --print-uris failed (run apt-get update?)"
stamp=$(
    printf '%s\n' "$uris" | awk '{print $2, $4}' | sort
    dpkg-query -W -f='${Package} ${Version}\n' "${GO_PKGS[@]}" golang-github-hashicorp-go-hclog-dev \
        golang-github-hashicorp-go-msgpack-dev golang-github-armon-go-metrics-dev 2>/dev/null | sort
    cd "$EXAMPLES" && sha256sum raft/build.sh raft/raftkv/*.go kvclient/*.go
)
if [ -f "$OUT/stamp" ] && [ "$(cat "$OUT/stamp")" = "$stamp" ] &&
    [ -f "$OUT/index.json" ] && [ -f "$OUT/oci-layout" ]; then
    log "up to date: $OUT"
else
    # --- Go, GOPATH mode on Debian's sources -------------------------------------
    GP=$WORK/gopath
    mkdir -p "$GP/src/detvisor.example"
    cp -r "$HERE/raftkv" "$GP/src/detvisor.example/raftkv"
    cp -r "$EXAMPLES/kvclient" "$GP/src/detvisor.example/kvclient"
    mkdir -p "$CACHE/go-build"
    for prog in raftkv kvclient; do
        log "go build $prog"
        (cd "$GP/src/detvisor.example/$prog" &&
            GO111MODULE=off GOPATH="$GP:/usr/share/gocode" CGO_ENABLED=0 GOFLAGS= \
                GOCACHE="$CACHE/go-build" GOOS=linux GOARCH=amd64 \
                go build -trimpath -ldflags '-s -w -buildid=' -o "$WORK/bin/$prog" .) ||
            die "go build $prog failed"
    done

    # --- layer 1 tree: Debian ----------------------------------------------------
    log "downloading ${DEB_PKGS[*]}"
    (cd "$WORK/debs" && apt-get download -q "${DEB_PKGS[@]}" >&2) || die "apt-get download failed"
    mkdir -p "$WORK/pkg"
    dpkg-deb -x "$(ls "$WORK"/debs/busybox-static_*.deb)" "$WORK/pkg"
    R1=$WORK/root1
    mkdir -p "$R1"/{bin,sbin,usr/bin,usr/sbin,usr/local/bin,etc,dev,proc,sys,run,tmp,root,var/lib}
    install -m 0755 "$WORK/pkg/bin/busybox" "$R1/bin/busybox"
    for a in $("$R1/bin/busybox" --list-full); do
        [ "$a" = bin/busybox ] && continue
        mkdir -p "$R1/$(dirname "$a")"
        [ -e "$R1/$a" ] || ln -s /bin/busybox "$R1/$a"
    done
    for a in "${REQUIRED_APPLETS[@]}"; do
        [ -L "$R1/bin/$a" ] || [ -L "$R1/usr/bin/$a" ] || die "busybox has no applet $a"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\n' >"$R1/etc/passwd"
    printf 'root:x:0:\n' >"$R1/etc/group"
    printf '127.0.0.1\tlocalhost\n::1\tlocalhost\n' >"$R1/etc/hosts"
    printf 'hosts: files\n' >"$R1/etc/nsswitch.conf"
    printf '%s\n' "$stamp" | grep -v '  ' >"$R1/etc/detvisor-raft-packages"
    chmod 1777 "$R1/tmp"
    chmod 0700 "$R1/root"

    # --- layer 2 tree: our programs ----------------------------------------------
    R2=$WORK/root2
    mkdir -p "$R2/usr/local/bin"
    install -m 0755 "$WORK/bin/raftkv" "$R2/usr/local/bin/raftkv"
    install -m 0755 "$WORK/bin/kvclient" "$R2/usr/local/bin/kvclient"

    # --- blobs (as examples/etcd/build-oci.sh) -----------------------------------
    STAGE=$WORK/oci
    mkdir -p "$STAGE/blobs/sha256"
    put_blob() {
        local h
        h=$(sha256sum <"$1" | cut -d' ' -f1)
        mv "$1" "$STAGE/blobs/sha256/$h"
        chmod 0644 "$STAGE/blobs/sha256/$h"
        printf '%s\n' "$h"
    }
    size_of() { stat -c %s "$STAGE/blobs/sha256/$1"; }
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
    printf '{"architecture":"amd64","config":{"Cmd":["raftkv","--id","n1","--peers","n1=127.0.0.1:7000"],"Env":["PATH=%s"],"WorkingDir":"/"},"created":"1970-01-01T00:00:00Z","history":[{"created":"1970-01-01T00:00:00Z","created_by":"examples/raft/build.sh: Debian %s"},{"created":"1970-01-01T00:00:00Z","created_by":"examples/raft/build.sh: raftkv, kvclient"}],"os":"linux","rootfs":{"diff_ids":["sha256:%s","sha256:%s"],"type":"layers"}}' \
        "$PATH_ENV" "${DEB_PKGS[*]}" "$D1" "$D2" >"$WORK/config.json"
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

    mkdir -p "$(dirname "$OUT")"
    rm -rf "$OUT.old.$$"
    [ -e "$OUT" ] && mv -T "$OUT" "$OUT.old.$$"
    mv -T "$STAGE" "$OUT"
    rm -rf "$OUT.old.$$"
    log "built $OUT: manifest sha256:$MAN, layers sha256:$L1 ($(stat -c %s "$OUT/blobs/sha256/$L1") B) and sha256:$L2 ($(stat -c %s "$OUT/blobs/sha256/$L2") B)"
fi

if [ -n "$IMAGE" ]; then
    "${DETVISOR:-detvisor}" image build --oci "$OUT:latest" --out "$IMAGE" >&2 ||
        die "detvisor image build --out $IMAGE failed"
fi
printf '%s\n' "$OUT"
