#!/usr/bin/env python3
"""mproc's public names: what the headers declare, what libmproc.so exports.

  names_test.py clash SRC CC LIB.so   no exported symbol, function, type, tag,
                                      enum constant or macro of mproc is also
                                      one of libtommath's (tommath.h) or GMP's
                                      (gmp.h): programs link both with mproc.
  names_test.py exports SRC CC LIB.so libmproc.so exports exactly the
                                      functions include/ declares: no mp__
                                      internals, none missing; no name
                                      retired before 1.0 comes back; every
                                      X_retain has an X_release and no
                                      X_destroy (_release drops a reference).

Declared names come from clang's AST of the preprocessed header, minus what
the same system headers alone declare, and macros from `-dM` minus the same
baseline; so only a header's own names count, wherever they are spelled.
Stdlib only. Exit 0 when clean, 1 with the offending names listed.
"""
import json
import os
import subprocess
import sys
import tempfile

# System headers the headers under test include, so that their names
# cancel out of both sides.
BASELINE = ["stdarg.h", "stdbool.h", "stddef.h", "stdint.h", "stdio.h", "limits.h",
            "sys/types.h", "dlpack/dlpack.h"]


# Names renamed before 1.0 (docs/api-stability.md): the sync objects'
# _acquire/_release were the lock and unlock, their _destroy the reference
# drop. None may be declared or exported again: the old mp_lock_release meant
# unlock, and a returning name would silently change what old code does.
RETIRED = {"mp_init", "mp_err"} | {
    "mp_%s_acquire" % kind for kind in ("lock", "rlock", "condition", "semaphore")} | {
    "mp_%s_destroy" % kind
    for kind in ("lock", "rlock", "condition", "semaphore", "event", "barrier")}
# The names whose meaning changed: declared again, but as reference drops.
REDEFINED = {"mp_lock_release", "mp_rlock_release", "mp_condition_release",
             "mp_semaphore_release"}


def run(cmd):
    res = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if res.returncode != 0:
        sys.exit("names_test: %s failed:\n%s" % (" ".join(cmd), res.stderr))
    return res.stdout


def source_with(includes, incdirs):
    fd, path = tempfile.mkstemp(suffix=".c")
    with os.fdopen(fd, "w") as f:
        for h in includes:
            f.write("#include <%s>\n" % h)
    return path


def declared(clang, includes, incdirs):
    """Names declared at file scope (functions, variables, typedefs, tags,
    enum constants) by a translation unit including `includes`."""
    path = source_with(includes, incdirs)
    try:
        out = run([clang, "-std=gnu11", "-fsyntax-only", "-Xclang", "-ast-dump=json"]
                  + ["-I" + d for d in incdirs] + [path])
    finally:
        os.unlink(path)
    names = {}

    def visit(node, top):
        kind = node.get("kind", "")
        name = node.get("name")
        if name and kind in ("FunctionDecl", "VarDecl", "TypedefDecl", "EnumConstantDecl",
                             "RecordDecl", "EnumDecl"):
            names.setdefault(name, kind)
        # Enum constants and nested tags count; parameters and fields do not.
        for child in node.get("inner", []):
            if kind in ("TranslationUnitDecl", "EnumDecl", "LinkageSpecDecl") or (
                    kind == "RecordDecl" and child.get("kind") == "RecordDecl"):
                visit(child, False)

    visit(json.loads(out), True)
    return names


def macros(cc, includes, incdirs):
    path = source_with(includes, incdirs)
    try:
        out = run([cc, "-std=gnu11", "-E", "-dM"] + ["-I" + d for d in incdirs] + [path])
    finally:
        os.unlink(path)
    return {line.split()[1].split("(")[0] for line in out.splitlines()
            if line.startswith("#define ")}


def own_names(cc, clang, includes, incdirs):
    """Every name a header set adds to a program, with what it is."""
    base_decl = declared(clang, BASELINE, incdirs)
    base_macro = macros(cc, BASELINE, incdirs)
    names = {n: k for n, k in declared(clang, BASELINE + includes, incdirs).items()
             if n not in base_decl}
    for m in macros(cc, BASELINE + includes, incdirs) - base_macro:
        names.setdefault(m, "macro")
    return names


def exported(lib):
    out = run(["nm", "-D", "--defined-only", lib])
    syms = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3:
            syms.add(parts[2].split("@")[0])
    return syms


def clang_for(cc):
    for c in ("clang", "clang-14", cc):
        if subprocess.run(["sh", "-c", "command -v " + c], stdout=subprocess.DEVNULL).returncode == 0:
            return c
    sys.exit("names_test: clang is needed for its AST dump (scripts/deps installs it)")


def clash(src, cc, lib):
    clang = clang_for(cc)
    inc = os.path.join(src, "include")
    ours = own_names(cc, clang, ["mproc.h"], [inc])
    for s in exported(lib):
        ours.setdefault(s, "exported symbol")
    bad = []
    for header, pkg in (("tommath.h", "libtommath-dev"), ("gmp.h", "libgmp-dev")):
        theirs = own_names(cc, clang, [header], [inc])
        if not theirs:
            sys.exit("names_test: %s declares nothing: is %s installed?" % (header, pkg))
        for n in sorted(set(ours) & set(theirs)):
            bad.append("%s: mproc's %s is also %s's %s" % (n, ours[n], header, theirs[n]))
        print("checked %d mproc names against %d of %s" % (len(ours), len(theirs), header))
    if bad:
        print("FAIL: names shared with libraries programs link beside mproc:\n  "
              + "\n  ".join(bad))
        return 1
    print("ok: no mproc name clashes with libtommath or GMP")
    return 0


def lifetimes(names, syms):
    """Failures: retired names, and refcounted types without the one drop."""
    bad = ["%s: renamed before 1.0 (docs/api-stability.md); it must not be "
           "declared or exported again" % n for n in sorted(RETIRED & (set(names) | syms))]
    for n in sorted(n for n in names if n.endswith("_retain")):
        base = n[:-len("_retain")]
        if base + "_release" not in names:
            bad.append("%s has no %s_release: a refcounted object drops a reference "
                       "with _release" % (n, base))
        if base + "_destroy" in names:
            bad.append("%s_destroy: %s is refcounted, so its drop is %s_release "
                       "(_destroy is for objects one owner holds)" % (base, base, base))
    for n in sorted(REDEFINED):
        if n not in names:
            bad.append("%s is not declared: it is the reference drop" % n)
        elif names[n] != "void":
            bad.append("%s returns %s: the reference drop returns void, so old code "
                       "checking an unlock's result fails to compile" % (n, names[n]))
    return bad


def return_types(clang, incdirs):
    """Each declared function's return type, from the same AST."""
    path = source_with(["mproc.h"], incdirs)
    try:
        out = run([clang, "-std=gnu11", "-fsyntax-only", "-Xclang", "-ast-dump=json"]
                  + ["-I" + d for d in incdirs] + [path])
    finally:
        os.unlink(path)
    types = {}
    for node in json.loads(out).get("inner", []):
        if node.get("kind") == "FunctionDecl" and "name" in node:
            types[node["name"]] = node["type"]["qualType"].split("(")[0].strip()
    return types


def exports(src, cc, lib):
    clang = clang_for(cc)
    inc = os.path.join(src, "include")
    names = own_names(cc, clang, ["mproc.h"], [inc])
    funcs = {n for n, k in names.items() if k == "FunctionDecl"}
    syms = exported(lib)
    types = return_types(clang, [inc])
    bad = lifetimes({n: types.get(n, "") for n in funcs}, syms)
    bad += ["%s is declared as a %s" % (n, k) for n, k in sorted(names.items())
            if n in RETIRED and k != "FunctionDecl"]
    for b in bad:
        print("FAIL: " + b)
    # The linker's own symbols; anything else must be a declared function.
    ours = {s for s in syms if s not in ("_init", "_fini", "_edata", "_end", "__bss_start")
            and not s.startswith(("__asan", "__ubsan", "__sanitizer", "__odr_asan"))}
    extra = sorted(ours - funcs)
    missing = sorted(funcs - ours)
    for s in extra:
        print("FAIL: %s is exported but not declared in include/ (mark it static, or "
              "drop MP_API)" % s)
    for s in missing:
        print("FAIL: %s is declared in include/ but not exported (define it, with the "
              "header included so MP_API applies)" % s)
    if extra or missing or bad:
        return 1
    print("ok: libmproc.so exports exactly the %d declared functions; no retired "
          "name; every _retain pairs with a _release" % len(funcs))
    return 0


def main(argv):
    if len(argv) != 5 or argv[1] not in ("clash", "exports"):
        sys.exit(__doc__)
    return {"clash": clash, "exports": exports}[argv[1]](argv[2], argv[3], argv[4])


if __name__ == "__main__":
    sys.exit(main(sys.argv))
