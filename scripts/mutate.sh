#!/usr/bin/env bash
# Mutation testing of the core: gremlins (pinned in the GNUmakefile)
# changes one operator of a package's code at a time (a < for a <=, a ==
# for a !=, a + for a -, ...) and runs that package's tests against each
# mutant. A mutant the tests pass "lived": the tests cannot tell that code
# from what it should be. Packages run one after the other, one mutant at a
# time, under nice, so that a shared machine stays usable.
#
#   scripts/mutate.sh GREMLINS PKG...      (make mutate calls it)
#
# Environment:
#   MUTATE_OUT      where the results go (default: bin/mutate): per package
#                   <pkg>.json (gremlins' own) and <pkg>.txt (its output)
#   MUTATE_TIMEOUT  gremlins' timeout coefficient (default 10): a mutant
#                   whose build and tests take over 10 times the package's
#                   first (cached) run is "timed out", counted apart and as
#                   killed. gremlins' own default, 3, times out mutants
#                   whose package merely takes longer to build uncached.
#   MUTATE_EXCLUDE  regexps of file names left out, space-separated
#                   (gremlins -E, matched against the path inside the
#                   package: "^serve\.go$")
#   MUTATE_ONLY     file names of the package to mutate, space-separated
#                   ("start.go stop.go"): every other file of it is left
#                   out (a run of a whole package takes hours on 2 cores)
#
# Tests run with -short and -count=1 (GOFLAGS): the tests that start a whole role run
# the capyctl binary built beforehand, without the mutant, so they cannot
# kill one, and they take most of a package's time. Then
# scripts/mutants prints the score per package and every mutant that lived
# and is not listed, with its reason, in scripts/mutants/survivors.tsv;
# it exits 1 when there is one.
set -euo pipefail
cd "$(dirname "$0")/.."

gremlins="${1:?usage: scripts/mutate.sh GREMLINS PKG...}"
shift
out="${MUTATE_OUT:-bin/mutate}"
mkdir -p "$out"
# -count=1: a cached test result would make gremlins' timing run take no
# time, and every mutant time out.
export GOFLAGS="${GOFLAGS:+$GOFLAGS }-short -count=1"

results=()
for pkg in "$@"; do
	pkg="${pkg#./}"
	name="${pkg//\//_}"
	# -E /: a subpackage is a package of its own (gremlins walks the
	# folders below; list a subpackage in MUTATE_PKGS to mutate it).
	args=(unleash --workers 1 --timeout-coefficient "${MUTATE_TIMEOUT:-10}" -o "$out/$name.json" -E /)
	for x in ${MUTATE_EXCLUDE:-}; do
		args+=(-E "$x")
	done
	if [ -n "${MUTATE_ONLY:-}" ]; then
		for f in "$pkg"/*.go; do
			f="${f##*/}"
			case "$f" in *_test.go) continue ;; esac
			case " $MUTATE_ONLY " in *" $f "*) ;; *) args+=(-E "^${f//./\\.}\$") ;; esac
		done
	fi
	echo "== $pkg ($(date +%H:%M:%S))"
	start=$(date +%s)
	# gremlins' exit status says nothing here (no thresholds are set):
	# the JSON is read below.
	nice -n 19 "$gremlins" "${args[@]}" "./$pkg" >"$out/$name.txt" 2>&1 || true
	echo "   $(grep -E '^(Killed|Test efficacy)' "$out/$name.txt" | tr '\n' ' ') in $(($(date +%s) - start)) s"
	results+=("$pkg=$out/$name.json")
done
nice -n 19 go run ./scripts/mutants -survivors scripts/mutants/survivors.tsv "${results[@]}"
