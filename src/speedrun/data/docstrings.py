"""English prose from the local Python installation: stdlib docstrings (via ast, nothing is
imported) and the pydoc topics. Every machine has it, so the embedded pipeline needs no network."""
from __future__ import annotations

import ast
import inspect
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from speedrun.common import stable_unit

SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test", "_bundled"}


@dataclass(frozen=True)
class DocObject:
    module: str  # dotted module path, e.g. "json.decoder"
    top: str  # split unit: top-level module (or pydoc topic)
    qualname: str  # e.g. "json.dumps"
    kind: str  # module | class | function | topic
    header: str  # what help() shows first: name and signature
    docstring: str

    @property
    def text(self) -> str:
        return f"{self.header}\n\n{self.docstring}"

    @property
    def summary(self) -> str:
        """First paragraph of the docstring, whitespace collapsed."""
        return " ".join(self.docstring.strip().split("\n\n")[0].split())


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(top: str, val_frac: float, salt: str = "split") -> str:
    """train/val by a stable hash of the top-level module: all of a module lands on one side."""
    return "val" if stable_unit(salt, top) < val_frac else "train"


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    return f"({ast.unparse(node.args)})"


def _objects_in_module(tree: ast.Module, module: str, top: str) -> list[DocObject]:
    out: list[DocObject] = []
    doc = ast.get_docstring(tree)
    if doc:
        out.append(DocObject(module, top, module, "module", f"module {module}", inspect.cleandoc(doc)))

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if node.name.startswith("_"):
                continue
            qual = f"{prefix}.{node.name}"
            doc = ast.get_docstring(node)
            if isinstance(node, ast.ClassDef):
                bases = ", ".join(ast.unparse(b) for b in node.bases)
                header = f"class {qual}({bases})" if bases else f"class {qual}"
                if doc:
                    out.append(DocObject(module, top, qual, "class", header, inspect.cleandoc(doc)))
                visit(node.body, qual)
            elif doc:
                out.append(DocObject(module, top, qual, "function", qual + _signature(node), inspect.cleandoc(doc)))

    visit(tree.body, module)
    return out


def _pydoc_topics(root: Path) -> list[DocObject]:
    path = root / "pydoc_data" / "topics.py"
    if not path.exists():
        return []
    tree = ast.parse(path.read_bytes(), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "topics" for t in node.targets):
            topics = ast.literal_eval(node.value)
            return [
                DocObject(f"pydoc_data.topics.{k}", f"topic:{k}", k, "topic", f"topic {k}", inspect.cleandoc(v))
                for k, v in sorted(topics.items())
                if v.strip()
            ]
    raise ValueError(f"{path}: no `topics = {{...}}` dict found")


def collect(root: Path | None = None) -> tuple[list[DocObject], dict[str, int]]:
    """All documented public objects of the stdlib, in a deterministic order, plus skip counts."""
    root = root or stdlib_dir()
    objects: list[DocObject] = []
    skipped = {"unparsable_file": 0}
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS and not d.startswith("."))
        files.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    for path in sorted(files):
        rel = path.relative_to(root).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if not parts or parts[0] == "pydoc_data" or any(p.startswith("_") and p != "__main__" for p in parts[:1]):
            continue
        module = ".".join(parts)
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError, UnicodeDecodeError):
            skipped["unparsable_file"] += 1  # e.g. lib2to3 test data with Python 2 syntax
            continue
        objects.extend(_objects_in_module(tree, module, parts[0]))
    objects.extend(_pydoc_topics(root))
    return objects, skipped
