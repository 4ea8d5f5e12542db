"""The multi-pass methods: each a second pass of the scoring path (another text, another model, sampled
continuations, gradients) and a ``combine`` function, registered in ``scorers.MULTI_PASS`` when this package is
imported (``mia_jax.score`` and every command import it).

- ``basic``: ``lowercase``, ``ref`` (Smaller-Ref), ``neighbor`` (the neighbourhood attack, ``neighbors``);
- ``pac`` (``augment``), ``camia_repeat``, ``recall`` / ``con_recall``, ``em_mia``, ``infilling``, ``gradient``
  (GradNorm), ``sampling`` (SaMIA, ``samia``; the n-gram coverage attack, ``ngram_coverage``);
- ``resources``: every method's options as CLI flags, and the resources a method reads (``freq``: DC-PDD's
  frequency table).

A method's pass is registered with ``engine.passes.register_pass`` and its combine function with
``scorers.register_multi_pass``; the single-pass formulas are in :mod:`mia_jax.scorers`.
"""
from mia_jax.methods import (basic, camia_repeat, em_mia, gradient, infilling, pac, recall,  # noqa: F401 (registers)
                             sampling)
