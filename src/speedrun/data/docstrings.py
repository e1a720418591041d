"""English prose from the local Python installation: stdlib docstrings (via ast, nothing is
imported) and the pydoc topics. Every machine has it, so the embedded pipeline needs no network.

Only the corpus stage reads the interpreter's files (`collect`); it writes the object table
(data/corpus/objects.parquet, `objects_frame`), and the SFT and preference-pair stages read that
(`load_objects`): another Python cannot change their data behind DVC's back."""
from __future__ import annotations

import ast
import inspect
import platform
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from speedrun.common import UserError, read_parquet, stable_hash, stable_unit
from speedrun.data.stdlib import stdlib_dir, stdlib_files


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


def split_of(top: str, val_frac: float, salt: str = "split") -> str:
    """train/val by a stable hash of the top-level module: all of a module lands on one side."""
    return "val" if stable_unit(salt, top) < val_frac else "train"


def heldout_split(top: str, val_frac: float, eval_frac: float) -> str:
    """The one post-training split, by top-level module: val = the corpus's val modules (never pretrained on; SFT
    and the RM pick checkpoints there); eval = a further `eval_frac` of the pretrained modules, which no
    post-training stage sees, so the evaluation asks about what the model knows from pretraining alone; train =
    the rest."""
    if split_of(top, val_frac) == "val":
        return "val"
    return "eval" if stable_unit("heldout", top) < eval_frac else "train"


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
    raise UserError(f"{path}: no `topics = {{...}}` dict found")


def collect(root: Path | None = None) -> tuple[list[DocObject], dict[str, int]]:
    """All documented public objects of the stdlib, in a deterministic order, plus skip counts."""
    root = root or stdlib_dir()
    objects: list[DocObject] = []
    skipped = {"unparsable_file": 0}
    for path in stdlib_files(root):
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


OBJECT_COLUMNS = ["module", "top", "qualname", "kind", "header", "docstring"]


def objects_frame(objects: list[DocObject]) -> pd.DataFrame:
    """The object table, in collect() order."""
    return pd.DataFrame([[getattr(o, c) for c in OBJECT_COLUMNS] for o in objects], columns=OBJECT_COLUMNS)


def objects_stats(objects: list[DocObject]) -> dict[str, str | int]:
    """What the corpus stage read: the interpreter and a digest of every object, for stats.json."""
    return {"python": platform.python_version(), "stdlib": str(stdlib_dir()), "objects": len(objects),
            "objects_digest": stable_hash(*(f"{o.qualname}\0{o.kind}\0{o.text}" for o in objects))}


def load_objects(path: Path) -> list[DocObject]:
    """The object table written by the corpus stage; a bad row is named."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: no object table (the corpus stage writes it: dvc repro corpus)")
    df = read_parquet(path)
    missing = [c for c in OBJECT_COLUMNS if c not in df.columns]
    if missing:
        raise UserError(f"{path}: missing columns {missing} (has {list(df.columns)})")
    out = []
    for i, row in enumerate(df[OBJECT_COLUMNS].itertuples(index=False)):
        if not all(isinstance(v, str) for v in row):
            raise UserError(f"{path} row {i}: every column must be a string, got {tuple(row)!r:.200}")
        out.append(DocObject(*row))
    if not out:
        raise UserError(f"{path}: no objects")
    return out
