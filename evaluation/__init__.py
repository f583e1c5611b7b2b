"""Tabulations, protected-versus-true comparisons, experiments and reports."""
