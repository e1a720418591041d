"""`python -m speedrun <stage>`: the `speedrun` command (speedrun.cli)."""
from speedrun.cli import main

main()
