#!/bin/sh
# tools/check_backend_api.sh: the core names a backend uses are a documented set (run by make
# test, through compile-check).
# The set: every mlc__name that a backend (mlc_opencl.h, examples/backend_skeleton.c) names and
# mlc.h has, less the backend's own (mlc__cl*, mlc__opencl_*). Each must have a row of
# docs/backends.md's table of core helpers (a line starting "| `mlc__name`"), and each row must
# name something mlc.h still has. Prints the names that break either rule; exits 1 if any.
set -u
cd "$(dirname "$0")/.." || exit 1
doc=docs/backends.md
backends="mlc_opencl.h examples/backend_skeleton.c"
for f in mlc.h $doc $backends; do
    [ -f "$f" ] || { echo "check_backend_api: $f not found"; exit 1; }
done
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

names() { grep -ho 'mlc__[A-Za-z0-9][A-Za-z0-9_]*' "$@" | sort -u; }
names mlc.h >"$tmp/core"
names $backends | grep -v -e '^mlc__cl$' -e '^mlc__cl_' -e '^mlc__opencl_' >"$tmp/named"
comm -12 "$tmp/named" "$tmp/core" >"$tmp/used"
sed -n 's/^| *`\(mlc__[A-Za-z0-9_]*\)`.*/\1/p' $doc | sort -u >"$tmp/listed"

status=0
missing=$(comm -23 "$tmp/used" "$tmp/listed")
if [ -n "$missing" ]; then
    echo "check_backend_api: a backend uses core names that $doc does not list (add a row to its table of core helpers):"
    for n in $missing; do echo "  $n ($(grep -lw "$n" $backends | tr '\n' ' ' | sed 's/ $//'))"; done
    status=1
fi
stale=$(comm -23 "$tmp/listed" "$tmp/core")
if [ -n "$stale" ]; then
    echo "check_backend_api: $doc lists core names that mlc.h no longer has:"
    for n in $stale; do echo "  $n"; done
    status=1
fi
unused=$(comm -12 "$tmp/listed" "$tmp/core" | comm -23 - "$tmp/used" | tr '\n' ' ')
[ -n "$unused" ] && echo "check_backend_api: listed, and used by no backend here (fine): $unused"
[ "$status" -eq 0 ] && echo "check_backend_api: the $(wc -l <"$tmp/used" | tr -d ' ') core names the backends use are in $doc"
exit $status
