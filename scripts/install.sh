#!/bin/sh
# Install CapyCTL: download a release archive for this machine (or take it
# from a local release directory), check it against the release's
# SHA256SUMS, and install capyctl, its example configurations and job
# specs, and its systemd units, for the current user (default) or
# system-wide.
#
#   curl -fsSL <release url>/install.sh | sh
#   curl -fsSL <release url>/install.sh | sh -s -- --version v0.2.0 --system
#   sh install.sh --from dist          (what make release built, no network)
#
# Options:
#   --version VERSION  a release tag (v0.2.0); default: the latest release
#   --from DIR         install from a release directory on this machine
#                      (the archives and SHA256SUMS, as make release leaves
#                      them in dist/); nothing is downloaded
#   --system           install to /usr/local and /etc/systemd/system (as
#                      root); default: ~/.local and ~/.config/systemd/user
#   --prefix DIR       install capyctl into DIR/bin and the examples into
#                      DIR/share/capyctl instead
#   --bin-dir DIR      install capyctl into DIR instead
#   --no-units         do not install the systemd units
#
# Environment:
#   CAPYCTL_RELEASE_URL   releases base URL (default
#                         https://github.com/capyctl/capyctl/releases); a
#                         tag is fetched from <base>/download/<tag>/, the
#                         latest from <base>/latest/download/
#   CAPYCTL_ARCH          amd64 or arm64 instead of uname -m
#   CAPYCTL_INSTALL_ROOT  prefix every system path (packaging, tests)
#
# An archive whose checksum does not match SHA256SUMS is refused and
# nothing is installed.
set -eu

base="${CAPYCTL_RELEASE_URL:-https://github.com/capyctl/capyctl/releases}"
version=""
from=""
system=0
prefix=""
bin_dir=""
units=1
root="${CAPYCTL_INSTALL_ROOT:-}"

say() { printf 'capyctl install: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

while [ $# -gt 0 ]; do
  case "$1" in
    --version) [ $# -ge 2 ] || die "--version needs a value"; version="$2"; shift 2 ;;
    --version=*) version="${1#*=}"; shift ;;
    --from) [ $# -ge 2 ] || die "--from needs a directory"; from="$2"; shift 2 ;;
    --from=*) from="${1#*=}"; shift ;;
    --system) system=1; shift ;;
    --prefix) [ $# -ge 2 ] || die "--prefix needs a value"; prefix="$2"; shift 2 ;;
    --prefix=*) prefix="${1#*=}"; shift ;;
    --bin-dir) [ $# -ge 2 ] || die "--bin-dir needs a value"; bin_dir="$2"; shift 2 ;;
    --no-units) units=0; shift ;;
    -h|--help) sed -n '2,37p' "$0" 2>/dev/null || true; exit 0 ;;
    *) die "unknown option $1 (--version, --from, --system, --prefix, --bin-dir, --no-units)" ;;
  esac
done

os="$(uname -s | tr '[:upper:]' '[:lower:]')"
[ "$os" = linux ] || die "CapyCTL runs on Linux, not $os"
arch="${CAPYCTL_ARCH:-$(uname -m)}"
case "$arch" in
  x86_64|amd64) arch=amd64 ;;
  aarch64|arm64) arch=arm64 ;;
  *) die "no release for the $arch architecture (amd64 and arm64 only)" ;;
esac

if [ -n "$from" ]; then
  [ -z "$version" ] || die "--from installs what the directory holds: leave --version out"
  [ -d "$from" ] || die "--from $from is not a directory"
  url="$(cd "$from" && pwd)"
elif [ -n "$version" ]; then
  case "$version" in v*) ;; *) version="v$version" ;; esac
  url="$base/download/$version"
else
  url="$base/latest/download"
fi

if [ "$system" = 1 ]; then
  [ -n "$root" ] || [ "$(id -u)" = 0 ] || die "--system installs as root (run it with sudo, or install for your user without --system)"
  : "${prefix:=$root/usr/local}"
  unit_dir="$root/etc/systemd/system"
  unit_src="system"
else
  : "${HOME:?HOME is not set}"
  : "${prefix:=$HOME/.local}"
  unit_dir="${XDG_CONFIG_HOME:-$HOME/.config}/systemd/user"
  unit_src="user"
fi
: "${bin_dir:=$prefix/bin}"
share_dir="$prefix/share/capyctl"

fetch() {
  if command -v curl >/dev/null 2>&1; then
    curl -fsSL --retry 2 -o "$2" "$1"
  elif command -v wget >/dev/null 2>&1; then
    wget -q -O "$2" "$1"
  else
    die "neither curl nor wget is installed"
  fi
}

sha256() {
  if command -v sha256sum >/dev/null 2>&1; then
    sha256sum "$1" | cut -d' ' -f1
  elif command -v shasum >/dev/null 2>&1; then
    shasum -a 256 "$1" | cut -d' ' -f1
  else
    die "neither sha256sum nor shasum is installed: cannot check the download"
  fi
}

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT INT TERM

archive="capyctl-linux-$arch.tar.gz"
if [ -n "$from" ]; then
  say "installing from $url/$archive"
  cp "$url/$archive" "$tmp/$archive" 2>/dev/null || die "$url has no $archive (make release builds it)"
  cp "$url/SHA256SUMS" "$tmp/SHA256SUMS" 2>/dev/null || die "$url has no SHA256SUMS: refusing to install an unchecked archive"
else
  say "downloading $url/$archive"
  fetch "$url/$archive" "$tmp/$archive" || die "download of $url/$archive failed"
  fetch "$url/SHA256SUMS" "$tmp/SHA256SUMS" || die "download of $url/SHA256SUMS failed"
fi

want="$(awk -v f="$archive" '$2 == f || $2 == "*" f { print $1; exit }' "$tmp/SHA256SUMS")"
[ -n "$want" ] || die "SHA256SUMS lists no $archive: refusing to install an unchecked archive"
got="$(sha256 "$tmp/$archive")"
if [ "$got" != "$want" ]; then
  die "checksum mismatch for $archive: SHA256SUMS says $want, the download is $got; nothing was installed"
fi
say "checksum ok ($got)"

mkdir -p "$tmp/x"
tar -xzf "$tmp/$archive" -C "$tmp/x"
src="$(find "$tmp/x" -mindepth 1 -maxdepth 1 -type d | head -n 1)"
[ -n "$src" ] && [ -f "$src/capyctl" ] || die "the archive holds no capyctl binary"

mkdir -p "$bin_dir"
cp "$src/capyctl" "$bin_dir/.capyctl.new"
chmod 0755 "$bin_dir/.capyctl.new"
mv -f "$bin_dir/.capyctl.new" "$bin_dir/capyctl"
say "installed $bin_dir/capyctl"

# The example role configurations and job specs (configs/jobs, as in the
# source tree and the docs).
if [ -d "$src/configs" ]; then
  mkdir -p "$share_dir/configs"
  for d in jobs roles; do
    [ -d "$src/configs/$d" ] || continue
    rm -rf "$share_dir/configs/$d"
    cp -R "$src/configs/$d" "$share_dir/configs/$d"
  done
  cp "$src/CHANGELOG.md" "$share_dir/" 2>/dev/null || true
  say "installed the example configurations and job specs in $share_dir/configs"
fi

units_dir="$src/configs/systemd/$unit_src"
installed_units=0
if [ "$units" = 1 ] && [ -d "$units_dir" ]; then
  mkdir -p "$unit_dir"
  # The units name the default place of the binary; point them at the
  # one installed (as the running system sees it, without the root prefix).
  exe="${bin_dir#"$root"}/capyctl"
  for u in "$units_dir"/*.service; do
    [ -f "$u" ] || continue
    sed -e "s#/usr/local/bin/capyctl #$exe #" -e "s#%h/.local/bin/capyctl #$exe #" "$u" > "$unit_dir/$(basename "$u")"
    chmod 0644 "$unit_dir/$(basename "$u")"
    say "installed $unit_dir/$(basename "$u")"
    installed_units=1
  done
fi

"$bin_dir/capyctl" version >&2 || die "the installed capyctl does not run on this machine"
case ":$PATH:" in
  *":$bin_dir:"*) ;;
  *) say "note: $bin_dir is not on your PATH" ;;
esac
say "try it without a GPU: capyctl dev (Ctrl-C stops it and leaves nothing behind)"
if [ "$installed_units" = 1 ]; then
  if [ "$system" = 1 ]; then
    say "next, as a service: useradd --system --home /var/lib/capyctl --shell /usr/sbin/nologin --groups video capyctl; capyctl init standalone --output /etc/capyctl/standalone.hcl; systemctl daemon-reload; systemctl enable --now capyctl-standalone (models go in /var/lib/capyctl-models)"
  else
    say "next, as a service: capyctl init standalone --output ~/.config/capyctl/standalone.hcl; systemctl --user daemon-reload; systemctl --user enable --now capyctl-standalone (models go in ~/models)"
  fi
fi
