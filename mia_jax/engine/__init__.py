"""The scoring engine: texts in, per-text records out, on one device or a pod.

``batching`` (at the package's top: tokenize, pack and pad into fixed shapes) feeds ``runner`` (a pass over texts:
plan, pack, the device step ``score_step``, ``records`` written as they finish, resumable; ``score_dataset`` the main
pass and each multi-pass method's second ``passes``), ``shards`` (a corpus in shards, streamed), ``compilation``
(the persistent compile cache), ``inflight`` (steps in flight while the host writes), ``sharding`` (meshes,
partition rules, sharded loading), ``windowed`` (online detection over sliding windows), ``generate`` (sampling;
its top-k / top-p filters in ``nucleus``).
"""
