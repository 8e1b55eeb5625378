#!/usr/bin/env bash
# Build CapyCTL release archives: one capyctl binary per Linux target with
# the version and commit embedded, each in a tar.gz with the license, the
# README, the changelog, the example role configurations and job specs and
# the systemd units (configs/), a SHA256SUMS file over the archives and the
# installer, and the release's notes (its CHANGELOG.md section).
#
#   scripts/release.sh [VERSION] COMMIT     (make release calls it)
#
# The version: VERSION when given (make release VERSION=0.2.0), else the
# release tag on HEAD (v0.2.0, from `git tag -a v0.2.0`); without either,
# or on a tree with uncommitted changes and no VERSION, nothing is built.
# A tagged release needs the SDK module's tag on HEAD as well (sdk/v0.2.0,
# from `git tag -a sdk/v0.2.0`): driver authors require the SDK by it.
# CHANGELOG.md must have the version's section ("## 0.2.0 (2027-01-15)"):
# scripts/changelog.sh cut 0.2.0 makes it from "## Unreleased". A
# pre-release (0.2.0-rc.1) without a section of its own takes the
# Unreleased one.
#
# Environment:
#   RELEASE_DIR      where the archives go (default: dist)
#   RELEASE_TARGETS  space-separated GOOS/GOARCH pairs (default:
#                    "linux/amd64 linux/arm64")
#   RELEASE_CHANGELOG the changelog to take the notes from (default:
#                    CHANGELOG.md)
#   RELEASE_ALLOW_NO_NVML  1 to build a target without cgo when no C
#                    compiler for it is here (see below)
#
# The NVML GPU provider needs cgo. A target is built with cgo when a C
# compiler for it is here (gcc for the machine's own architecture,
# aarch64-linux-gnu-gcc or x86_64-linux-gnu-gcc for the other one). A
# binary built without cgo sees no NVIDIA GPU, so such a target is refused
# unless RELEASE_ALLOW_NO_NVML=1; then its BUILD file says so, and the
# binary too (capyctl version, and "no GPU found (this build of capyctl
# has no NVML ...)" at start).
set -euo pipefail
cd "$(dirname "$0")/.."

version="${1:-}"
commit="${2:?usage: scripts/release.sh [VERSION] COMMIT}"
die() { echo "release: $*" >&2; exit 1; }
if [ -z "$version" ]; then
  tag="$(git describe --tags --exact-match --match 'v[0-9]*' HEAD 2>/dev/null || true)"
  [ -n "$tag" ] || die "HEAD has no release tag: tag it (git tag -a v0.2.0 -m 'CapyCTL 0.2.0') or give the version (make release VERSION=0.2.0)"
  [ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || die "the tree has uncommitted changes: a tagged release is built from the tag alone (commit or stash them, or give VERSION=)"
  version="$tag"
  # The SDK is a Go module of its own (sdk/go.mod): driver authors require
  # github.com/capyctl/capyctl/sdk at the tag sdk/vX.Y.Z, which Go's module
  # proxy resolves for a module in a sub-directory. A release tags both.
  git describe --tags --exact-match --match "sdk/$tag" HEAD >/dev/null 2>&1 ||
    die "HEAD has $tag but not sdk/$tag, the SDK module's tag of the same release: git tag -a sdk/$tag -m 'CapyCTL SDK ${tag#v}'"
fi
version="${version#v}"
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] || die "version $version is not MAJOR.MINOR.PATCH[-PRERELEASE]"
out="${RELEASE_DIR:-dist}"
targets="${RELEASE_TARGETS:-linux/amd64 linux/arm64}"
changelog="${RELEASE_CHANGELOG:-CHANGELOG.md}"
pkg="github.com/capyctl/capyctl/core/version"
go="${GO:-go}"

# notes prints the changelog section of a version: from its "## <version>"
# heading (v-prefixed or not, a date may follow) to the next "## ".
notes() {
  awk -v v="$1" '
    /^## / { if (on) exit; h = $2; sub(/^v/, "", h); if (h == v) { on = 1; next } }
    on { print }
  ' "$changelog"
}
[ -f "$changelog" ] || die "no changelog at $changelog"
release_notes="$(notes "$version")"
if [ -z "$(printf '%s' "$release_notes" | tr -d '[:space:]')" ]; then
  if [[ "$version" == *-* ]]; then
    release_notes="$(notes Unreleased)"
  fi
  [ -n "$(printf '%s' "$release_notes" | tr -d '[:space:]')" ] ||
    die "$changelog has no \"## $version\" section: move the Unreleased entries under it (scripts/changelog.sh cut $version) and commit"
fi

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

# Every target is checked before anything is built.
for target in $targets; do
  os="${target%/*}"
  arch="${target#*/}"
  if [ -z "$(cc_for "$os" "$arch")" ] && [ "${RELEASE_ALLOW_NO_NVML:-}" != 1 ]; then
    die "no C compiler for $os/$arch here, and a capyctl built without cgo sees no NVIDIA GPU: install one (gcc-aarch64-linux-gnu or gcc-x86-64-linux-gnu), build on a linux/$arch machine, leave the target out (RELEASE_TARGETS=linux/$hostarch), or ship it GPU-blind with RELEASE_ALLOW_NO_NVML=1"
  fi
done

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
  cp LICENSE README.md CHANGELOG.md "$stage/"
  mkdir -p "$stage/configs"
  cp -R configs/jobs configs/roles configs/systemd "$stage/configs/"
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
printf '# CapyCTL %s\n%s\n' "$version" "$release_notes" > "$out/RELEASE_NOTES.md"
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
