"""``python -m kvcli``: the command line."""
from kvcli.cli.app import main

main()
