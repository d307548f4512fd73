"""`python -m switchboard` runs the CLI."""

from switchboard.cli import main

main()
