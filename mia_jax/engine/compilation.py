"""JAX's persistent compilation cache, on by default, and a count of what a run compiled.

Every command that scores turns the cache on (``enable``) before its first jit call: a compiled program is kept in
``$MIA_JAX_COMPILATION_CACHE`` (default ``$XDG_CACHE_HOME/mia_jax/jax`` or ``~/.cache/mia_jax/jax``), so the
same command run again reads its programs back instead of compiling them (on an H100 one WikiMIA-32 program took
51 s to compile with XLA's autotuner). ``MIA_JAX_COMPILATION_CACHE=off`` (or ``0``, ``none``, ``""``) turns it
off; ``--compilation-cache DIR|off`` on the command line wins over the variable.

``CompileCount`` counts, between its start and ``stop()``, the programs XLA built or read from the cache and the
seconds that took, from JAX's own monitoring events (``/jax/core/compile/backend_compile_duration`` and
``/jax/compilation_cache/cache_hits``), for ``run.json``'s ``"compile"`` entry.

After a full disk stopped a run, ``drop_entries_written`` removes the cache files it wrote (one may be cut short).
"""
from __future__ import annotations

import os
import threading
import time
import warnings
from pathlib import Path

import jax
from jax import monitoring

from mia_jax.errors import UserError

ENV = "MIA_JAX_COMPILATION_CACHE"
OFF = ("off", "0", "none", "false", "")
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # jax._src.dispatch.BACKEND_COMPILE_EVENT
_HIT_EVENT = "/jax/compilation_cache/cache_hits"


def default_dir() -> Path:
    """The default folder of JAX's persistent compilation cache: ``$XDG_CACHE_HOME/mia_jax/jax`` (else
    ``~/.cache/mia_jax/jax``)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "mia_jax" / "jax"


def resolve(option: str | None = None) -> Path | None:
    """The cache folder an option (``--compilation-cache``; None: not given) and ``$MIA_JAX_COMPILATION_CACHE``
    ask for; None when turned off."""
    value = option if option is not None else os.environ.get(ENV)
    if value is None:
        return default_dir()
    if value.strip().lower() in OFF:
        return None
    return Path(value).expanduser()


_enabled: list[Path | None] = []
_enabled_at: list[int] = []  # time.time_ns() when enable ran


def enable(option: str | None = None) -> Path | None:
    """Turn JAX's persistent compilation cache on in the resolved folder (created if needed) and return it; None
    when turned off. Every program is cached, however fast it compiled. A folder that cannot be created is a
    UserError. Later calls with another folder are ignored (JAX reads the setting once per process)."""
    path = resolve(option)
    if _enabled:
        return _enabled[0]
    if path is not None:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"compilation cache folder {path}: {e.strerror}; give another with --compilation-cache "
                            f"DIR or ${ENV}, or turn it off with {ENV}=off") from None
        # a full disk is reported once, by the write of the run's own files (entry.run), not also by JAX's warning
        # about the cache entry it could not write (whose cut file drop_entries_written then removes)
        warnings.filterwarnings("ignore", message="Error writing persistent compilation cache entry .*"
                                "(File too large|No space left on device|Disk quota exceeded)")
        jax.config.update("jax_compilation_cache_dir", str(path))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    _enabled.append(path)
    _enabled_at.append(time.time_ns())
    return path


def drop_entries_written() -> int:
    """Delete the cache files written since ``enable`` (this process's, and any other's in the same seconds);
    returns how many. For a run a full disk (or ``ulimit -f``) stopped: JAX writes an entry in place and never
    rewrites one that exists, so an entry cut short would fail to load, with a warning and a recompilation, on every
    later run. ``entry.run`` calls it on a full-disk error."""
    if not _enabled or _enabled[0] is None:
        return 0
    since = _enabled_at[0] - 1_000_000_000  # a second of slack for coarse file-system timestamps
    dropped = 0
    for path in _enabled[0].iterdir():
        try:
            if path.is_file() and path.stat().st_mtime_ns >= since:
                path.unlink()
                dropped += 1
        except OSError:
            pass
    return dropped


def cache_dir() -> str | None:
    """The folder ``enable`` turned the cache on in (None: off, or not enabled in this process)."""
    return str(_enabled[0]) if _enabled and _enabled[0] is not None else None


_lock = threading.Lock()
_local = threading.local()
_log: list[tuple[str, float, bool]] = []  # (function name, seconds, read from the cache) per program


def _on_event(event: str, **_) -> None:
    if event == _HIT_EVENT:  # fired inside the compile it answers, on the same thread, before its duration event
        _local.hit = True


def _on_duration(event: str, seconds: float, fun_name: str = "", **_) -> None:
    if event == _COMPILE_EVENT:
        hit, _local.hit = getattr(_local, "hit", False), False
        with _lock:
            _log.append((str(fun_name), float(seconds), hit))


monitoring.register_event_duration_secs_listener(_on_duration)
monitoring.register_event_listener(_on_event)


class CompileCount:
    """The programs XLA built or read from the persistent cache since construction (``current``/``stop``):
    ``programs``, ``compiled`` (built), ``cache_hits`` (read back) and ``seconds`` (both), for every jitted
    function or only the one named ``name`` (JAX reports ``jit(name)``). JAX's events name the function, not the caller:
    count around the work to count."""

    def __init__(self, name: str | None = None):
        self.names = None if name is None else (name, f"jit({name})")
        with _lock:
            self._start = len(_log)
        self._result: dict | None = None

    def current(self) -> dict:
        """The counts so far: ``{programs, compiled, cache_hits, seconds}``."""
        with _lock:
            mine = [e for e in _log[self._start:] if self.names is None or e[0] in self.names]
        hits = sum(e[2] for e in mine)
        return {"programs": len(mine), "compiled": len(mine) - hits, "cache_hits": hits,
                "seconds": round(sum(e[1] for e in mine), 3)}

    def stop(self) -> dict:
        """The counts at the first call (later calls return the same dict)."""
        if self._result is None:
            self._result = self.current()
        return self._result
