# Doxygen INPUT_FILTER for include/ (cmake/Doxyfile.in). The headers use
# plain C comments, which Doxygen ignores; this turns them into doc comments
# on the fly, keeping every line where it is (warnings point at real lines):
#  - the file's opening comment documents the file (@file);
#  - a comment at column 0 (a section rule "/* ---- properties ----" too)
#    documents the declarations right below it, up to the next blank line:
#    `int mp_x_create(..);` and `void mp_x_destroy(..);` under one comment
#    are both documented (a Doxygen member group, DISTRIBUTE_GROUP_DOC);
#  - an indented comment (a struct field) documents what follows it, and a
#    comment after code on its line documents that line's member.
# A public function with no comment above it (in its block) stays
# undocumented, which the docs check (tests/build/apidoc_test.sh) reports.
function trail(line) {
    if (line ~ /^[ \t]*[^ \t\/*].*\/\*[^*]/)
        sub(/\/\*/, "/**<", line)
    return line
}
function flush(open_group,   i) {
    for (i = 1; i <= n; i++)
        print (i == 1 && open_group ? "/**@{*/" : "") buf[i]
    n = 0
}
# a line that can sit inside a member group: not blank, no preprocessor,
# braces balanced on the line (a one-line enum is fine, a struct body is not)
function member(line,   o, c) {
    o = gsub(/{/, "{", line); c = gsub(/}/, "}", line)
    return line !~ /^[ \t]*$/ && line !~ /^#/ && line !~ /^\/\*/ && o == c
}
NR == 1 && /^\/\*[^*]/ {
    sub(/^\/\*/, "/**")
    if (/\*\//) { sub(/\*\//, "\\file */"); print; next }
    print; mode = "file"; next
}
mode == "file" { if (/\*\//) { sub(/\*\//, "\\file */"); mode = "" } print; next }
mode == "doc" { buf[++n] = $0; if (/\*\//) mode = "after"; next }
mode == "after" {
    # the first line after a column-0 comment decides: a member starts a group
    ingroup = member($0)
    flush(ingroup)
    mode = ingroup ? "group" : ""
}
mode == "group" && !member($0) { printf "/**@}*/"; mode = "" }
/^\/\*[^*]/ {
    line = $0; sub(/\/\*/, "/**", line)
    if (line ~ /^\/\*\* *----/)
        gsub(/ *----*/, "", line)   # a section rule's title is the text
    buf[++n] = line
    mode = /\*\// ? "after" : "doc"; next
}
/^[ \t]+\/\*[^*]/ { sub(/\/\*/, "/**"); print; next }
{ print trail($0) }
END { if (n) flush(0); if (mode == "group") print "/**@}*/" }
