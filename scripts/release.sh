#!/usr/bin/env bash
# Build CapyCTL release archives: one capyctl binary per Linux target with
# the version and commit embedded, each in a tar.gz with the license, the
# README and the systemd units, and a SHA256SUMS file over the archives.
#
#   scripts/release.sh VERSION COMMIT        (make release calls it)
#
# Environment:
#   RELEASE_DIR      where the archives go (default: dist)
#   RELEASE_TARGETS  space-separated GOOS/GOARCH pairs (default:
#                    "linux/amd64 linux/arm64")
#
# The NVML GPU provider needs cgo. A target is built with cgo when a C
# compiler for it is here (gcc for the machine's own architecture,
# aarch64-linux-gnu-gcc or x86_64-linux-gnu-gcc for the other one);
# otherwise it is built with CGO_ENABLED=0, and that binary sees no NVIDIA
# GPU (the simulated provider and gpu.provider = "none" still work). The
# archive's BUILD file says which.
set -euo pipefail
cd "$(dirname "$0")/.."

version="${1:?usage: scripts/release.sh VERSION COMMIT}"
commit="${2:?usage: scripts/release.sh VERSION COMMIT}"
version="${version#v}"
out="${RELEASE_DIR:-dist}"
targets="${RELEASE_TARGETS:-linux/amd64 linux/arm64}"
pkg="github.com/capyctl/capyctl/core/version"
go="${GO:-go}"

hostos="$($go env GOOS)"
hostarch="$($go env GOARCH)"

# cc_for prints the C compiler for a target, or nothing.
cc_for() {
  local os="$1" arch="$2"
  [ "$os" = linux ] || return 0
  if [ "$os" = "$hostos" ] && [ "$arch" = "$hostarch" ] && command -v gcc >/dev/null 2>&1; then
    echo gcc; return 0
  fi
  case "$arch" in
    arm64) command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 && echo aarch64-linux-gnu-gcc ;;
    amd64) command -v x86_64-linux-gnu-gcc >/dev/null 2>&1 && echo x86_64-linux-gnu-gcc ;;
  esac
  return 0
}

rm -rf "$out"
mkdir -p "$out/stage"
archives=()
for target in $targets; do
  os="${target%/*}"
  arch="${target#*/}"
  name="capyctl-${version}-${os}-${arch}"
  stage="$out/stage/$name"
  mkdir -p "$stage"
  cc="$(cc_for "$os" "$arch")"
  cgo=0
  nvml="no: built without cgo (no C compiler for $os/$arch here); NVIDIA GPUs are not seen"
  if [ -n "$cc" ]; then
    cgo=1
    nvml="yes"
  fi
  echo "building $name (cgo=$cgo${cc:+, CC=$cc})" >&2
  CGO_ENABLED="$cgo" CC="${cc:-cc}" GOOS="$os" GOARCH="$arch" \
    $go build -trimpath -ldflags "-s -w -X $pkg.Version=$version -X $pkg.Commit=$commit" \
    -o "$stage/capyctl" ./cmd/capyctl
  cp LICENSE README.md "$stage/"
  mkdir -p "$stage/systemd"
  cp -R configs/systemd/. "$stage/systemd/"
  cat > "$stage/BUILD" <<INFO
version: $version
commit: $commit
target: $os/$arch
cgo: $cgo
nvml: $nvml
INFO
  archive="capyctl-${os}-${arch}.tar.gz"
  tar -C "$out/stage" --owner=0 --group=0 --numeric-owner --sort=name \
    --mtime='2000-01-01 00:00:00Z' -czf "$out/$archive" "$name"
  archives+=("$archive")
done
rm -rf "$out/stage"
cp scripts/install.sh "$out/install.sh"
(
  cd "$out"
  if command -v sha256sum >/dev/null 2>&1; then
    sha256sum "${archives[@]}" install.sh > SHA256SUMS
  else
    shasum -a 256 "${archives[@]}" install.sh > SHA256SUMS
  fi
)
echo "release $version ($commit) in $out:" >&2
ls -l "$out" >&2
