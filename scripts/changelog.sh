#!/usr/bin/env bash
# Cut a release's section of CHANGELOG.md: the entries under
# "## Unreleased" move under "## VERSION (DATE)", and an empty
# "## Unreleased" takes their place for what comes next.
#
#   scripts/changelog.sh cut 0.2.0 [DATE]     (make changelog-cut VERSION=0.2.0)
#
# DATE defaults to today (UTC, YYYY-MM-DD). The file is CHANGELOG.md, or
# $RELEASE_CHANGELOG. A version that has a section already, or an empty
# Unreleased section, is refused. Then commit, tag and build:
#
#   git commit -am 'changelog: 0.2.0'
#   git tag -a v0.2.0 -m 'CapyCTL 0.2.0'
#   make release              (the version comes from the tag)
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "changelog: $*" >&2; exit 1; }
[ "${1:-}" = cut ] || die "usage: scripts/changelog.sh cut VERSION [DATE]"
version="${2:?usage: scripts/changelog.sh cut VERSION [DATE]}"
version="${version#v}"
date="${3:-$(date -u +%Y-%m-%d)}"
file="${RELEASE_CHANGELOG:-CHANGELOG.md}"
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] || die "version $version is not MAJOR.MINOR.PATCH[-PRERELEASE]"
[ -f "$file" ] || die "no changelog at $file"
grep -q '^## Unreleased[[:space:]]*$' "$file" || die "$file has no \"## Unreleased\" section"
if awk -v v="$version" '/^## / { h = $2; sub(/^v/, "", h); if (h == v) found = 1 } END { exit !found }' "$file"; then
  die "$file has a \"## $version\" section already"
fi
entries="$(awk '/^## Unreleased[[:space:]]*$/ { on = 1; next } /^## / { on = 0 } on' "$file" | grep -c '^- ' || true)"
[ "$entries" -gt 0 ] || die "the Unreleased section of $file lists nothing to release"

tmp="$(mktemp "$file.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
awk -v head="## $version ($date)" '
  /^## Unreleased[[:space:]]*$/ && !done { print; print ""; print head; done = 1; next }
  { print }
' "$file" > "$tmp"
chmod --reference="$file" "$tmp" 2>/dev/null || true
mv "$tmp" "$file"
trap - EXIT
echo "changelog: $entries entries of Unreleased are now under \"## $version ($date)\" in $file" >&2
