"""``python -m kvcli`` and the ``kvcli`` console script (pyproject.toml's ``[project.scripts]``): the command line.

Importing the command line (typer, rich, the command modules) takes up to a second; a Ctrl-C in that time ends the
command as one during its work does, one line and exit 130, not a traceback. Only the standard library is imported
before that guard is in place.
"""
import signal
import sys


def main() -> None:
    """Run the command line (:func:`kvcli.cli.app.main`: exit 130 after SIGINT, 143 after SIGTERM), also when the
    SIGINT comes while it is still being imported."""
    try:
        from kvcli.cli.app import main as run

        run()
    except KeyboardInterrupt:  # before kvcli.cli.app.main turned SIGINT into its own exit
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # exiting already: a second Ctrl-C changes nothing
        sys.stderr.write("kvcli: interrupted\n")
        sys.exit(128 + signal.SIGINT)


if __name__ == "__main__":
    main()
