"""What DVC pays after every stage it runs: rewriting dvc.lock (ruamel.yaml's round-trip parse and dump, pure Python).

    python bench/lock_rewrite.py                       # the repository's dvc.lock, 5 rewrites
    python bench/lock_rewrite.py --lock /tmp/x/dvc.lock --times 3

DVC records each finished stage by parsing the whole lock file in round-trip mode (comments and layout kept) and
dumping it again (dvc.dvcfile.Lockfile.dump_stages -> dvc.utils.serialize.modify_yaml), so a stage's bookkeeping grows
with the lock's size: the lines of every stage's code deps (path, hash, md5, size) and params. Times that rewrite on a
copy of the file (the original is not touched) and counts the lock's lines by kind."""
from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

import typer
import yaml

from speedrun.typer_app import new_app

app = new_app()


def line_shares(lock: dict) -> dict[str, int]:
    """Lines of the lock by kind (a dep or out: 4 lines, 5 for a directory; a param: 1 line per key and value)."""
    def lines(v: object) -> int:
        if isinstance(v, dict):
            return sum(1 + lines(x) for x in v.values())
        return sum(1 + lines(x) for x in v) if isinstance(v, list) and any(isinstance(x, dict | list) for x in v) \
            else 0
    out = {"code deps": 0, "data deps": 0, "params": 0, "outs": 0}
    for st in lock.get("stages", {}).values():
        for d in st.get("deps", []):
            out["code deps" if d["path"].startswith(("src/", "stages/")) else "data deps"] += 4 + ("nfiles" in d)
        out["params"] += sum(1 + lines(ps) for ps in st.get("params", {}).values())
        out["outs"] += sum(4 + ("nfiles" in o) for o in st.get("outs", []))
    return out


@app.command(help=__doc__)
def main(lock: Path = typer.Option(Path("dvc.lock"), help="the lock file to time (copied first)"),
         times: int = typer.Option(5, help="rewrites timed")) -> None:
    from dvc.utils.serialize import modify_yaml
    text = lock.read_text()
    print(f"{lock}: {len(text.splitlines()):,} lines, {len(yaml.safe_load(text).get('stages', {}))} stages; "
          + ", ".join(f"{k} {v:,}" for k, v in line_shares(yaml.safe_load(text)).items()) + " lines")
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "dvc.lock"
        shutil.copy(lock, copy)
        took = []
        for i in range(times):
            start = time.perf_counter()
            with modify_yaml(str(copy)) as data:  # what DVC does after each stage, with one changed entry
                data["schema"] = "2.0"
            took.append(time.perf_counter() - start)
            print(f"rewrite {i + 1}: {took[-1]:.3f} s")
    print(f"median {statistics.median(took):.3f} s per stage DVC runs (min {min(took):.3f})")


if __name__ == "__main__":
    app()
