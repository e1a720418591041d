"""The pipeline's stages: thin commands over the `speedrun` library in src/.

`dvc exp run --queue` runs an experiment in a copy of the repository under .dvc/tmp/exps, while an editable install
points `import speedrun` at the main work tree, whose code may have changed since the experiment was queued. Putting
this copy's own src/ first makes a stage run the code DVC hashed for it. (Import plumbing only: it changes no output,
so dvc.yaml does not list this file as a dependency.)"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
