"""The lab notebook stays out of the method: docs/method.md names no commit or earlier recipe, docs/LOG.md is dated
newest first and links every committed experiment with a result."""
import re
from pathlib import Path

from speedrun import kept

REPO = Path(__file__).resolve().parents[1]
HEADING = re.compile(r"^## (\d{4}-\d{2}-\d{2})(?: to (\d{4}-\d{2}-\d{2}))?: ", re.M)


def test_method_is_method_only():
    text = (REPO / "docs/method.md").read_text()
    assert not re.findall(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b", text), "a commit id in method.md"
    for phrase in ("previous recipe", "previous default", "earlier run", "earlier design", "older code"):
        assert phrase not in text.lower(), f"method.md: '{phrase}' is history: it belongs in docs/LOG.md"


def test_log_is_dated_newest_first_and_links_every_experiment():
    text = (REPO / "docs/LOG.md").read_text()
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    dated = HEADING.findall(text)
    assert len(dated) == len(headings), "every LOG entry starts with its date"
    ends = [end or start for start, end in dated]
    assert ends == sorted(ends, reverse=True), "LOG entries newest first"
    for folder in sorted((REPO / "reports/experiments").iterdir()):
        if kept.exists(folder / "metrics"):  # a folder, or members of its results.zip
            assert f"reports/experiments/{folder.name})" in text, f"no LOG entry links {folder.name}"


def test_the_readme_map_names_every_module():
    """The README's map names each module of src/speedrun (a file, or its package's folder): a new file joins it."""
    readme = (REPO / "README.md").read_text()
    block = readme.split("## What is where", 1)[1].split("## ", 1)[0]
    src = REPO / "src" / "speedrun"
    names = [f.name for f in src.glob("*.py") if f.name not in ("__init__.py", "__main__.py")]
    names += [f"{d.name}/" for d in src.iterdir() if (d / "__init__.py").is_file()]
    missing = [n for n in sorted(names) if n not in block]
    assert not missing, f"README's map misses {missing}"
