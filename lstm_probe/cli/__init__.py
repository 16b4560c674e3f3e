"""The command line: ``app.py`` parses and calls the library function of the same name, ``flags.py``
builds flags from the options' declarations, ``render.py`` draws. The only layer that prints or exits."""

from lstm_probe.cli.app import app, main

__all__ = ["app", "main"]
