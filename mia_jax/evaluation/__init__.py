"""Honest metrics: AUROC and TPR at low FPR (``metrics``), their bootstrap intervals (``bootstrap``,
``group_metrics``), paired comparisons with Holm-corrected, seed-independent verdicts (``comparisons``, ``pvalue``,
``verdict_log``), the blind bag-of-words baseline (``blind``), dataset inference (``dataset_inference``), and the
report's tables, figures and rounding (``report``, ``rounding``).
"""
