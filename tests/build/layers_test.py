#!/usr/bin/env python3
"""A layer calls only layers below it (docs/architecture.md).

  layers_test.py DOC NM OBJECTS...

DOC is docs/architecture.md: its table's rows "| rank | `src/<folder>/` |"
give each folder's rank. OBJECTS are the object files of libmproc and
libmproc_mpi (CMake passes each target's list joined by ';'). For every
undefined symbol of an object file under src/<a>/ that another object
under src/<b>/ defines, rank(b) must be lower than rank(a): a call up, or
sideways between two layers of one rank, is an error listed with the
file and the symbol. Stdlib only. Exit 0 when clean, 1 otherwise.
"""
import collections
import os
import re
import subprocess
import sys


def ranks(doc):
    table = {}
    with open(doc, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"\|\s*(\d+)\s*\|\s*`src/([a-z_]+)/`\s*\|", line)
            if m:
                table[m.group(2)] = int(m.group(1))
    if len(table) < 5:
        sys.exit("layers_test: no layer table found in %s" % doc)
    return table


def folder(path):
    m = re.search(r"/src/([a-z_]+)/[^/]+$", path)
    return m.group(1) if m else None


def symbols(nm, path):
    """(defined, undefined) global symbol names of one object file."""
    out = subprocess.run([nm, "-P", path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, check=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        if parts[1] == "U":
            undefined.add(parts[0])
        elif parts[1] in "TDBRCVW":
            defined.add(parts[0])
    return defined, undefined


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    rank = ranks(sys.argv[1])
    nm = sys.argv[2]
    objects = [p for arg in sys.argv[3:] for p in arg.split(";") if p.endswith(".o")]
    owner, uses = {}, {}
    for path in objects:
        layer = folder(path)
        if layer is None:
            continue
        if layer not in rank:
            print("layers_test: src/%s/ is not in the table of %s" % (layer, sys.argv[1]))
            return 1
        defined, undefined = symbols(nm, path)
        for s in defined:
            owner[s] = layer
        uses[path] = (layer, undefined)
    bad = collections.defaultdict(list)
    edges = set()
    for path, (layer, undefined) in sorted(uses.items()):
        for s in sorted(undefined):
            callee = owner.get(s)
            if callee is None or callee == layer:
                continue
            edges.add((layer, callee))
            if rank[callee] >= rank[layer]:
                bad[(layer, callee)].append("%s: %s" % (os.path.basename(path), s))
    for (a, b), hits in sorted(bad.items()):
        print("src/%s/ (rank %d) calls src/%s/ (rank %d), which is not below it:"
              % (a, rank[a], b, rank[b]))
        for h in hits:
            print("    " + h)
    if bad:
        return 1
    print("ok: %d object files; %d pairs of layers with calls between them, all downwards"
          % (len(uses), len(edges)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
