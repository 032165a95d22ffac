#!/usr/bin/env python3
"""The structure rules of the tree, checked like a linter (docs/architecture.md):

  file-length      a source file over 800 lines
  function-length  a function body over 80 lines (found by matching braces)
  layering         an include of a folder the including folder may not use (LAYERS)
  friend           a friend declaration outside core/mutex.h
  model-name       a model kind compared by name outside models/ (== "hf", ...)

Tests, benchmarks, fuzz targets and generated code are left out. Any finding fails the
check.

    scripts/check_structure.py [--root DIR]
"""

import argparse
import os
import re
import sys

MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 80
SOURCE_DIRS = ["core", "proto", "data", "compression", "models", "aggregation", "split", "privacy", "server",
               "client", "edge", "job", "service", "tools", "cmd", "python/src"]
# The layering, declared here once (docs/architecture.md draws it): what each folder may
# include besides itself and third-party headers. Layers point down: core <- data,
# compression, privacy <- models, aggregation, split <- server, client <- edge (a server
# and a client), job <- service (the daemon) <- tools <- cmd (the programs' mains). "cleave" is the generated
# protocol (proto/).
LAYERS = {
    "core": set(),
    "proto": {"core", "cleave"},
    "data": {"core"},
    "compression": {"core"},
    "privacy": {"core"},
    "models": {"core", "compression", "data"},
    "aggregation": {"core", "compression", "privacy"},
    "split": {"core", "compression", "data", "models", "privacy"},
    "server": {"core", "proto", "cleave", "data", "compression", "models", "aggregation", "split", "privacy"},
    "client": {"core", "proto", "cleave", "data", "compression", "models", "aggregation", "split", "privacy"},
    "edge": {"core", "proto", "cleave", "data", "compression", "models", "aggregation", "split", "privacy", "server",
             "client"},
    "job": {"core", "proto", "cleave", "data", "compression", "models", "aggregation", "split", "privacy", "server",
            "client"},
    "service": {"core", "proto", "cleave", "data", "compression", "models", "aggregation", "split", "privacy",
                "server", "client", "job"},
    "tools": {"core", "proto", "cleave", "data", "compression", "models", "aggregation", "split", "privacy", "server",
              "client", "job", "service"},
    "cmd": None,  # the programs' mains: anything
    "python": None,
}
OURS = set(LAYERS) | {"cleave", "tests", "bench", "fuzz"}
# The registered model kinds (models/builtin_models.cc) and torchscript: outside models/
# code asks their traits (models/kinds.h).
MODEL_NAMES = ("mlp", "lenet5", "cnn", "vgg", "resnet", "gpt", "hf", "interop", "torchscript")
MODEL_NAME_COMPARISON = re.compile(r'(==|!=)\s*"(%s)"|"(%s)"\s*(==|!=)' % ("|".join(MODEL_NAMES), "|".join(MODEL_NAMES)))
CONTROL = re.compile(r"^\s*(if|for|while|switch|else|do|try|catch|namespace|class|struct|enum|union|extern)\b")


def sources(root):
    for d in SOURCE_DIRS:
        for base, _, files in os.walk(os.path.join(root, d)):
            for f in sorted(files):
                if f.endswith((".cc", ".h")):
                    yield os.path.relpath(os.path.join(base, f), root)


def strip_literals(line):
    """The line without string and character literals and // comments (for brace counting)."""
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])*'", "''", line)
    return line.split("//", 1)[0]


def functions(lines):
    """(name, first line, length) of each function body: a line that ends a signature with
    `{` (a parenthesis before it, not a control statement or a lambda) to its matching `}`."""
    found, in_raw = [], False
    i = 0
    while i < len(lines):
        raw = lines[i]
        if 'R"(' in raw and ')"' not in raw.split('R"(', 1)[1]:
            in_raw = True
        if in_raw:
            if ')"' in raw:
                in_raw = False
            i += 1
            continue
        code = strip_literals(raw).rstrip()
        # A signature may span lines: look back to the line where its name begins.
        if code.endswith("{") and ")" in code and not CONTROL.match(code) and "[" not in code.split("(")[0] \
                and "=" not in code.split("(")[0] and not code.lstrip().startswith(("}", ":", ",")):
            start, d = i, 0
            for j in range(i, len(lines)):
                c = strip_literals(lines[j])
                d += c.count("{") - c.count("}")
                if d <= 0:
                    # The name: the identifier before the first "(" of the signature, which
                    # may begin a few lines up (after the last statement, block or blank).
                    k = i
                    while k > max(0, i - 4) and lines[k - 1].strip() and \
                            not strip_literals(lines[k - 1]).rstrip().endswith((";", "}", "{")):
                        k -= 1
                    signature = " ".join(strip_literals(l) for l in lines[k:i + 1])
                    name = re.findall(r"([A-Za-z_][A-Za-z0-9_:~]*)\s*\(", signature)
                    if j - start - 1 > MAX_FUNCTION_LINES:
                        found.append((name[0] if name else "?", start + 1, j - start - 1))
                    break
        i += 1
    return found


def check(root):
    findings = []
    for path in sources(root):
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n")
        folder = path.split(os.sep)[0]
        if len(lines) > MAX_FILE_LINES:
            findings.append((f"file-length {path}", f"{path}: {len(lines)} lines, over {MAX_FILE_LINES}"))
        for name, line, length in functions(lines):
            findings.append((f"function-length {path} {name}",
                             f"{path}:{line}: {name} is {length} lines, over {MAX_FUNCTION_LINES}"))
        allowed = LAYERS.get(folder)
        for n, text in enumerate(lines, 1):
            m = re.match(r'\s*#include "([a-z_0-9]+)/', text)
            if m and allowed is not None and m.group(1) in OURS and m.group(1) not in allowed | {folder}:
                findings.append((f"layering {path} {m.group(1)}",
                                 f"{path}:{n}: includes {m.group(1)}/, which {folder}/ may not use"))
            code = strip_literals(text) if "friend" in text else ""
            if re.search(r"\bfriend\b", code) and path != os.path.join("core", "mutex.h"):
                findings.append((f"friend {path}: {text.strip()}", f"{path}:{n}: a friend declaration"))
            if folder != "models" and MODEL_NAME_COMPARISON.search(text):
                findings.append((f"model-name {path}: {text.strip()}",
                                 f"{path}:{n}: a model kind compared by name: {text.strip()}"))
    return findings


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    args = p.parse_args()
    findings = check(args.root)
    for _, msg in findings:
        print(msg)
    print(f"check_structure: {len(findings)} findings")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
