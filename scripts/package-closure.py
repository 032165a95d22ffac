"""The image sizes of docs/deployment.md without a Docker engine: the Installed-Size of the
package closure (Pre-Depends and Depends followed, the first installed alternative of
each, Recommends off) of the runtime image (scripts/runtime-packages.txt) and of the
build stage (install-deps.sh's PACKAGES), read from this machine's dpkg database (where
every package is installed)."""
import os
import re
import subprocess
import sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
runtime = [l.strip() for l in open(os.path.join(root, "scripts/runtime-packages.txt"))
           if l.strip() and not l.startswith("#")]
deps_script = open(os.path.join(root, "scripts/install-deps.sh")).read()
build = re.search(r"^PACKAGES=\((.*?)^\)", deps_script, re.S | re.M).group(1).split()
# Installed-Size (KiB) of each installed package and its Depends/Pre-Depends.
out = subprocess.run(["dpkg-query", "-W", "-f", "${Package}\t${Installed-Size}\t${Pre-Depends}, ${Depends}\t${Provides}\n"],
                     capture_output=True, text=True).stdout
size, deps, provides = {}, {}, {}
for line in out.splitlines():
    p, s, d, pr = line.split("\t")
    size[p] = int(s or 0)
    deps[p] = [[a.strip().split(" ")[0].split(":")[0] for a in alt.split("|")] for alt in d.split(",") if alt.strip()]
    for v in pr.split(","):
        v = v.strip().split(" ")[0]
        if v: provides.setdefault(v, p)
def closure(roots):
    seen, todo = set(), list(roots)
    while todo:
        p = todo.pop()
        p = p if p in size else provides.get(p)
        if p is None or p in seen: continue
        seen.add(p)
        for alt in deps[p]:
            for a in alt:
                if a in size or a in provides:
                    todo.append(a); break
    return seen
for name, roots in (("runtime image", runtime), ("build stage (the former image)", build)):
    c = closure(roots)
    print(f"{name}: {len(c)} packages, {sum(size[p] for p in c)/1024:.0f} MiB installed")
