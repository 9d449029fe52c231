#!/bin/sh
# tools/check_names.sh: the docs name what exists (run by make test, through compile-check).
#  (a) Every op of mlc.h's public API (the tensor- or module-returning functions of its sections
#      "Public API: ops" and "Public API: modules", the X-macro rows of mlc_<name> included)
#      appears in README.md: its full name anywhere, or its short name ("add", "nn_" dropped:
#      "lstm") in a `code span` of the README's "### Ops" or "### Modules" table.
#  (b) Every mlc_x, mlc__x, MLC_X or MLC__X that a /* comment */ of mlc.h or mlc_opencl.h names
#      (the OpenCL source's comments inside string literals too) is in the code: outside
#      comments in mlc.h, mlc_opencl.h, examples/, tests/ or bench/ (string literals count:
#      kernel names, getenv's variables), names made by ## or # from an X-macro row included.
#      "mlc__cl_*" or "MLC__CL_K_<name>" (a name ending in _) asks for a name with that prefix;
#      "mlc_opencl.h" asks for that file.
# Prints file:line and the name for each miss; exits 1 if any. POSIX sh and awk (mawk is fine).
set -u
cd "$(dirname "$0")/.." || exit 1

# Names a comment may cite that are not in the code, one a line: the name, then why (none today).
ALLOW='
'
export ALLOW

for f in mlc.h README.md; do
    [ -f "$f" ] || { echo "check_names: $f not found"; exit 1; }
done
status=0

# ---- (a) every public op is in the README -------------------------------------------------------
awk '
function token_set(text, set,   span) {      # the identifiers inside `code spans` of text
    while (match(text, /`[^`]*`/)) {
        span = substr(text, RSTART + 1, RLENGTH - 2); text = substr(text, RSTART + RLENGTH)
        while (match(span, /[A-Za-z_][A-Za-z0-9_]*/)) {
            set[substr(span, RSTART, RLENGTH)] = 1; span = substr(span, RSTART + RLENGTH)
        }
    }
}
FNR == 1 { file++ }
file == 1 {                                     # mlc.h: the two sections
    if ($0 ~ /Public API: /) {
        section = $0 ~ /Public API: ops/ ? "ops" : $0 ~ /Public API: modules/ ? "modules" : ""
        if (section != "") found[section] = 1
    }
    if ($0 ~ /^#endif \/\* MLC_H \*\//) section = ""
    if (section == "") next
    if ($0 ~ /MLCDEF/ && $0 ~ /mlc_##name/) paste[section] = 1
    if (match($0, /^[ \t]*X\([A-Za-z_][A-Za-z0-9_]*, *[a-z_][a-z0-9_]*/)) {
        row = substr($0, RSTART, RLENGTH); sub(/^.*, */, "", row)
        rows[section, ++nrows[section]] = row; rowline[section, nrows[section]] = FNR
    }
    if (match($0, /MLCDEF +mlc_(tensor|module) *\* *mlc_[a-z0-9_]+\(/)) {
        name = substr($0, RSTART, RLENGTH - 1); sub(/^.*\* */, "", name)
        op[++nops] = name; opsec[nops] = section; opline[nops] = FNR
    }
    next
}
{                                               # README.md
    if ($0 ~ /^#/) region = $0 ~ /^### Ops/ ? "ops" : $0 ~ /^### Modules/ ? "modules" : ""
    if (region != "") table[region] = table[region] " " $0
    line = $0
    while (match(line, /mlc_[a-z0-9_]+/)) {
        full[substr(line, RSTART, RLENGTH)] = 1; line = substr(line, RSTART + RLENGTH)
    }
}
END {
    for (s in found) nfound++
    if (nfound != 2) {
        print "check_names: mlc.h lacks its \"Public API: ops\" or \"Public API: modules\" section"; exit 1
    }
    if (!("ops" in table) || !("modules" in table)) {
        print "check_names: README.md lacks its ### Ops or ### Modules section"; exit 1
    }
    token_set(table["ops"], short_ops); token_set(table["modules"], short_modules)
    for (s in paste) for (i = 1; i <= nrows[s]; i++) {
        op[++nops] = "mlc_" rows[s, i]; opsec[nops] = s; opline[nops] = rowline[s, i]
    }
    for (i = 1; i <= nops; i++) {
        name = op[i]; short = name; sub(/^mlc_(nn_)?/, "", short)
        if (name in full) continue
        if (opsec[i] == "ops" && short in short_ops) continue
        if (opsec[i] == "modules" && short in short_modules) continue
        printf "mlc.h:%d: %s is not in README.md (### %s, or its full name anywhere)\n", opline[i], name,
               opsec[i] == "ops" ? "Ops" : "Modules"
        bad = 1
    }
    exit bad
}' mlc.h README.md || status=1

# ---- (b) every name a comment cites exists ----------------------------------------------------
code_files=$(ls mlc.h mlc_opencl.h examples/*.c examples/*.h examples/*/*.c tests/*.c tests/*.h tests/*/*.c \
             bench/*.c 2>/dev/null)
find . -name .git -prune -o -name build -prune -o -type f -print | sed 's|.*/||' | awk '
function add_code(s,   id) {
    while (match(s, /[A-Za-z_][A-Za-z0-9_]*/)) {
        id = substr(s, RSTART, RLENGTH); s = substr(s, RSTART + RLENGTH)
        if (id ~ /^(mlc|MLC)_/) have[id] = 1
    }
}
function add_comment(s,   before, name, after) {
    if (!checked) return
    while (match(s, /(mlc|MLC)__?[A-Za-z0-9][A-Za-z0-9_]*/)) {
        before = RSTART > 1 ? substr(s, RSTART - 1, 1) : ""
        name = substr(s, RSTART, RLENGTH); after = substr(s, RSTART + RLENGTH, 3)
        s = substr(s, RSTART + RLENGTH)
        if (before ~ /[A-Za-z0-9_]/) continue
        n++; cname[n] = name; cwhere[n] = FILENAME ":" FNR
        ckind[n] = name ~ /_$/ ? "prefix" : after ~ /^\.[ch]([^A-Za-z0-9_]|$)/ ? "file" : "name"
        if (ckind[n] == "file") cname[n] = name substr(after, 1, 2)
    }
}
function add_string(s) {                        # a string literal: code, less its /* comments */
    while (match(s, /\/\*([^*]|\*+[^*\/])*\*+\//)) {
        at = RSTART; len = RLENGTH; add_code(substr(s, 1, at - 1)); add_comment(substr(s, at, len))
        s = substr(s, at + len)
    }
    add_code(s)
}
FILENAME == "-" { files[$0] = 1; next }
FNR == 1 { in_comment = 0; checked = (FILENAME == "mlc.h" || FILENAME == "mlc_opencl.h") }
{
    line = $0
    # names made by pasting: "mlc_" #name, MLC__OP_##name; the rows of X-macro tables
    s = line
    while (match(s, /(mlc|MLC)_[A-Za-z0-9_]*("[ \t]*#|##)[A-Za-z_]/)) {
        p = substr(s, RSTART, RLENGTH); s = substr(s, RSTART + RLENGTH)
        sub(/("[ \t]*#|##).*$/, "", p); prefix[p] = 1
    }
    s = line
    while (match(s, /X\([A-Za-z_][A-Za-z0-9_]*(, *[A-Za-z_][A-Za-z0-9_]*)?/)) {
        before = RSTART > 1 ? substr(s, RSTART - 1, 1) : ""
        r = substr(s, RSTART + 2, RLENGTH - 2); s = substr(s, RSTART + RLENGTH)
        if (before ~ /[A-Za-z0-9_]/) continue
        k = split(r, parts, /, */); for (j = 1; j <= k; j++) row[parts[j]] = 1
    }
    # the line, cut into code, comments and literals
    while (line != "") {
        if (in_comment) {
            if (match(line, /\*\//)) {
                at = RSTART; add_comment(substr(line, 1, at + 1)); line = substr(line, at + 2); in_comment = 0
            } else { add_comment(line); line = "" }
            continue
        }
        if (!match(line, /\/\*|\/\/|"|'"'"'/)) { add_code(line); break }
        at = RSTART; len = RLENGTH; add_code(substr(line, 1, at - 1))
        tok = substr(line, at, len); line = substr(line, at + len)
        if (tok == "/*") in_comment = 1
        else if (tok == "//") { add_comment(line); line = "" }
        else if (tok == "\"") {
            if (match(line, /^([^"\\]|\\.)*"/)) {
                len = RLENGTH; add_string(substr(line, 1, len - 1)); line = substr(line, len + 1)
            } else { add_string(line); line = "" }
        } else if (match(line, /^([^'"'"'\\]|\\.)*'"'"'/)) line = substr(line, RLENGTH + 1)
        else line = ""
    }
}
END {
    for (p in prefix) for (r in row) have[p r] = 1
    k = split(ENVIRON["ALLOW"], lines, "\n")
    for (i = 1; i <= k; i++) if (split(lines[i], w, " ") > 0) allow[w[1]] = 1
    for (i = 1; i <= n; i++) {
        name = cname[i]
        if (name in allow) continue
        if (ckind[i] == "file") { if (name in files) continue }
        else if (ckind[i] == "prefix") {
            ok = 0; for (h in have) if (index(h, name) == 1) { ok = 1; break }
            if (ok) continue
        } else if (name in have) continue
        why = ckind[i] == "file" ? "no such file exists" : "is not in the code"
        if (ckind[i] == "prefix") why = "no name in the code starts with it"
        printf "%s: %s is named in a comment but %s\n", cwhere[i], name, why
        bad = 1
    }
    exit bad
}' - $code_files || status=1

[ "$status" -eq 0 ] && echo "check_names: README lists every op; every name a comment cites exists"
exit $status
