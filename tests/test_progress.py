"""Progress: a bar with rate and ETA on a terminal, plain line logs elsewhere."""
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
