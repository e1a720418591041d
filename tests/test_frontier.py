"""speedrun-frontier on `dvc exp show --json`-shaped records: points, table, figure, clear errors."""
import json

import pytest

from speedrun import frontier


def _record(name, beta, gain):
    block = lambda r, x: {"reward": r, "reward_ci_low": r - 0.1, "reward_ci_high": r + 0.1,  # noqa: E731
                          "ead_1": x, "ead_1_ci_low": x - 0.02, "ead_1_ci_high": x + 0.02}
    return {"rev": f"{name}-sha", "name": name, "data": {
        "params": {"params.yaml": {"data": {"beta": beta, "eval": {"primary": "ead_1,distinct_2"}}}},
        "metrics": {frontier.METRICS_FILE: {"data": {"density_vs_sft": block(gain, -0.05),
                                                     "baseline_vs_sft": block(gain - 0.1, -0.08),
                                                     "sft": {"reward": -0.5}}}}}}


SHOW = [{**_record("x", 0.04, 0.4), "rev": "workspace", "name": None},  # the same as main: left out
        {**_record("main", 0.04, 0.4), "experiments": [
            {"revs": [_record("beta-0.1", 0.1, 0.2)]}, {"revs": [{"rev": "q", "name": "queued", "data": {}}]}]}]


def test_points_per_experiment_and_variant():
    exps = frontier.experiments(SHOW)
    assert [e["name"] for e in exps] == ["main", "beta-0.1"]
    points = frontier.frontier_points(exps, "ead_1", "beta")
    assert [(p["variant"], p["sweep"]) for p in points] == [("baseline", 0.04), ("baseline", 0.1), ("density", 0.04),
                                                           ("density", 0.1)]
    d = points[2]
    assert (d["x"], d["y"], d["y_ci_low"], d["x_ci_high"]) == pytest.approx((-0.05, 0.4, 0.3, -0.03))
    assert "| beta-0.1 | 0.1 | density | -0.0500 [-0.0700, -0.0300] | +0.200 [+0.100, +0.300] |" in \
        frontier.table(points, "ead_1", "beta")


def test_an_arm_taken_from_the_cache_by_two_experiments_is_one_point():
    """An experiment that adds arms shows the default arms DVC took from the cache, scored as in its commit."""
    cached = _record("controls", 0.04, 0.4)
    cached["data"]["metrics"][frontier.METRICS_FILE]["data"]["density_vs_sft"]["reward"] = 0.45  # retrained: kept
    points = frontier.frontier_points(frontier.experiments([{**_record("main", 0.04, 0.4), "experiments": [
        {"revs": [cached]}]}]), "ead_1", "beta")
    assert [(p["variant"], p["experiment"]) for p in points] == [("baseline", "controls, main"),
                                                                ("density", "controls"), ("density", "main")]


def test_command_writes_the_figure_and_table(tmp_path, capsys):
    show = tmp_path / "exps.json"
    show.write_text(json.dumps(SHOW))
    frontier.main(show_json=show, metric="", sweep="beta", out=tmp_path / "f.png", table_out=tmp_path / "f.md")
    assert (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"
    assert "ead_1" in (tmp_path / "f.md").read_text()  # the first primary metric by default
    with pytest.raises(SystemExit, match="no experiment"):
        show.write_text(json.dumps([{"rev": "workspace", "data": {"metrics": {}, "params": {}}}]))
        frontier.main(show_json=show, metric="", sweep="beta", out=tmp_path / "g.png", table_out=None)
    show.write_text(json.dumps(SHOW))
    with pytest.raises(SystemExit, match="'nope'"):
        frontier.main(show_json=show, metric="nope", sweep="beta", out=tmp_path / "g.png", table_out=None)


def test_command_line_returns_in_process_and_reports_usage_errors(tmp_path, capsys):
    show = tmp_path / "exps.json"
    show.write_text(json.dumps(SHOW))
    frontier.cli(["--show-json", str(show), "--sweep", "beta", "--out", str(tmp_path / "f.png"),
                  "--table-out", str(tmp_path / "f.md")])  # a success returns: no SystemExit(0)
    assert "| beta-0.1 | 0.1 | density |" in capsys.readouterr().out and (tmp_path / "f.md").exists()
    frontier.cli(["-h"])
    assert "--table-out FILE" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        frontier.cli(["--show-json", str(show), "--bogus"])
    assert e.value.code == 2 and "No such option: --bogus" in capsys.readouterr().err
