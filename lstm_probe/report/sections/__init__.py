"""The report's sections, one module each; :mod:`lstm_probe.report.registry` lists them in order."""
