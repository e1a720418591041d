"""Progress: a bar with rate and ETA on a terminal, plain line logs elsewhere."""
import itertools

from speedrun.progress import Progress


def test_off_a_terminal_only_the_line_logs(capsys):
    with Progress(3, "train", enabled=False) as bar:
        bar.update(1, loss="0.5")
        bar.log("train step 1/3: loss 0.5")
    out = capsys.readouterr()
    assert out.out == "train step 1/3: loss 0.5\n" and out.err == ""


def test_on_a_terminal_a_bar_with_rate_and_eta(capsys):
    with Progress(4, "grpo", enabled=True) as bar:
        for _ in range(2):
            bar.update(1, reward="+0.1")
        bar.log("grpo step 2/4")
    out = capsys.readouterr()
    assert "grpo step 2/4" in out.out
    assert "grpo" in out.err and "2/4" in out.err and "reward=+0.1" in out.err and "<" in out.err  # elapsed<ETA


def test_off_a_terminal_a_loop_without_logs_prints_a_heartbeat(capsys, monkeypatch):
    """A long loop with no line logs of its own says how far it is at most every `every` seconds, never silent."""
    clock = itertools.chain([0.0, 10.0, 70.0, 80.0], itertools.repeat(200.0))
    monkeypatch.setattr("speedrun.progress.time.monotonic", lambda: next(clock))
    bar = Progress(4, "density k-NN", unit="block", enabled=False, every=60)  # starts at t=0
    for _ in range(3):
        bar.update(1)  # t=10: too soon; t=70: a line; t=80: too soon
    assert capsys.readouterr().out == "density k-NN: 2/4 blocks (50%), 1.2 min, about 1.2 min left\n"
    silent = Progress(4, "eval", enabled=False)  # every=0: the loop's own line logs only
    silent.update(4)
    assert capsys.readouterr().out == ""
