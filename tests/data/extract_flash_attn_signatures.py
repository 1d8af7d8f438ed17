"""Regenerate the flash-attn signature fixtures the compatibility tests read (``tests/test_flash_attn_api.py``).

The fixtures are *data*: per public ``flash_attn_*`` function of a flash-attn source file, its parameters in order
with their kind and default, read with :mod:`ast` (nothing of flash-attn is imported or run). Regenerate from a
clone of https://github.com/Dao-AILab/flash-attention (a bare clone is enough)::

    python tests/data/extract_flash_attn_signatures.py GIT_DIR v2.8.3 flash_attn/flash_attn_interface.py \\
        tests/data/flash_attn_2_8_signatures.json
    python tests/data/extract_flash_attn_signatures.py GIT_DIR 0251105a2fb19d2957484b7f023cd8c115286ced \\
        hopper/flash_attn_interface.py tests/data/flash_attn_3_signatures.json

The committed files were made from tag ``v2.8.3`` (flash-attn 2.8.3, commit 060c9188) and, for flash-attn 3
(``hopper/``, which has no release tags), from commit 0251105a (the file as last changed by 0f82fead,
2026-03-19); each file records its source.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys


def _default(node):
    """A default as JSON: a literal's value (tuples become lists); anything else is refused (the test could not
    compare it)."""
    value = ast.literal_eval(node)
    return list(value) if isinstance(value, tuple) else value


def signatures(source: str) -> dict:
    """``{name: [{"name", "kind", "default"?}, ...]}`` of every top-level ``def flash_attn_*`` in ``source``."""
    out = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.FunctionDef) or not node.name.startswith("flash_attn_"):
            continue
        a = node.args
        if a.posonlyargs or a.vararg or a.kwarg:
            raise ValueError(f"{node.name}: positional-only or variadic parameters are not described by the fixture")
        params = []
        positional = a.args
        first_default = len(positional) - len(a.defaults)
        for i, arg in enumerate(positional):
            entry = {"name": arg.arg, "kind": "positional_or_keyword"}
            if i >= first_default:
                entry["default"] = _default(a.defaults[i - first_default])
            params.append(entry)
        for arg, default in zip(a.kwonlyargs, a.kw_defaults):
            entry = {"name": arg.arg, "kind": "keyword_only"}
            if default is not None:
                entry["default"] = _default(default)
            params.append(entry)
        out[node.name] = params
    return out


def main(argv) -> int:
    if len(argv) != 5:
        print(__doc__)
        return 2
    git_dir, ref, path, dest = argv[1:]
    commit = subprocess.run(["git", "--git-dir", git_dir, "rev-parse", f"{ref}^{{commit}}"], check=True,
                            capture_output=True, text=True).stdout.strip()
    source = subprocess.run(["git", "--git-dir", git_dir, "show", f"{commit}:{path}"], check=True,
                            capture_output=True, text=True).stdout
    doc = {"source": f"Dao-AILab/flash-attention {ref} ({commit}) {path}",
           "functions": signatures(source)}
    with open(dest, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"{dest}: {len(doc['functions'])} functions from {doc['source']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
