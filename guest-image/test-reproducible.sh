#!/usr/bin/env bash
# Build the initramfs twice (in separate temp dirs, at different times) and
# check the bytes are identical; if the cached entry for the current key
# exists, its initramfs must be identical too.  (build.sh also does the
# twice-and-compare check on every real build.)
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/detvisor-repro.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/a" "$tmp/b"
(cd "$tmp/a" && umask 077 && "$HERE/build.sh" --initramfs "$tmp/a/initramfs.cpio.gz")
sleep 1
(cd "$tmp/b" && umask 002 && "$HERE/build.sh" --initramfs "$tmp/b/initramfs.cpio.gz")
a=$(sha256sum <"$tmp/a/initramfs.cpio.gz" | cut -d' ' -f1)
b=$(sha256sum <"$tmp/b/initramfs.cpio.gz" | cut -d' ' -f1)
echo "build 1: $a"
echo "build 2: $b"
fail=0
[ "$a" = "$b" ] || { echo "FAIL: initramfs differs between two builds"; fail=1; }
cached=${DETVISOR_CACHE:-$HOME/.cache/detvisor}/guest-image/$("$HERE/build.sh" --key)/initramfs.cpio.gz
if [ -f "$cached" ]; then
    c=$(sha256sum <"$cached" | cut -d' ' -f1)
    echo "cached:  $c"
    [ "$a" = "$c" ] || { echo "FAIL: cached initramfs differs"; fail=1; }
fi
[ $fail -eq 0 ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
exit $fail
