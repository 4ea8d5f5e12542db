"""Runs: the command's guard (``entry``: exit codes, one-line errors, Ctrl-C), run folders (``rundir``: claim, lock,
resume, ``--overwrite``), fingerprints (``fingerprint``), files written whole (``files``), preemption notices
(``preemption``) and the processes of a multi-host run (``processes``).
"""
