#!/usr/bin/env bash
# Builds the agent as a fully static executable (glibc's libc.a, from
# libc6-dev; no musl target needed) and prints its path on stdout.
#
#   guest-agent/build.sh [--debug]
#
# RUSTFLAGS applies to this invocation only, and with an explicit --target
# cargo does not apply it to build scripts and proc macros (serde_derive),
# which must stay dynamic. The build has its own target directory so it
# never invalidates the workspace's normal artifacts; override it with
# DETVISOR_AGENT_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."

target=x86_64-unknown-linux-gnu
profile=release
profile_flag=(--release)
if [ "${1:-}" = "--debug" ]; then
	profile=debug
	profile_flag=()
fi
target_dir=${DETVISOR_AGENT_TARGET_DIR:-${CARGO_TARGET_DIR:-$PWD/target}/agent-static}

if [ ! -e /usr/lib/x86_64-linux-gnu/libc.a ]; then
	echo "guest-agent/build.sh: glibc's libc.a is missing: apt-get install libc6-dev" >&2
	exit 1
fi

RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
	cargo build -p guest-agent "${profile_flag[@]}" --target "$target" \
	--target-dir "$target_dir" --bin detvisor-agent >&2

bin=$target_dir/$target/$profile/detvisor-agent
# Static means: no program interpreter and no needed shared libraries.
if readelf -lW "$bin" | grep -q 'INTERP' || readelf -dW "$bin" | grep -q '(NEEDED)'; then
	echo "guest-agent/build.sh: $bin is not statically linked:" >&2
	file "$bin" >&2 || true
	exit 1
fi
"$bin" --version >&2
echo "$bin"
