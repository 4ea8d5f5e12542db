"""Workflows built on scoring: windowed (online) detection; the copyrighted-book and unlearning audits."""
