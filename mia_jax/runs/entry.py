"""The one guard of every entry point: ``mia-jax`` and its subcommands, each ``scripts/*.py`` a user runs,
``python train/contaminate.py`` and every ``python -m train.*``.

    if __name__ == "__main__":
        sys.exit(entry.run("python -m train.tables", main, resume_hint="..."))

What every entry point gets from it:

- ``ArgumentParser``: a usage error is one line (``PROG: error: ... (see PROG --help)``) and exit 2, as every
  other user error, instead of argparse's usage block.
- Argument types that validate at parse time, before anything is read or written: ``positive_int``,
  ``nonneg_int``, ``positive_float``, ``fraction``, ``input_file``, ``input_dir``, ``out_file``, ``out_dir`` (not a
  file, not under a file, not a dangling link, a writable parent), ``source_dir`` (the ``--from`` folder of a
  rebuild).
  ``tests/test_entry_fuzz.py`` finds every entry point and feeds each option of these types bad values.
- ``run(prog, main)``: a ``UserError`` is one line and exit 2; so are the errors of the machine a user can fix
  (disk full, read-only file system, permission, a file where a folder is expected; ``SIGXFSZ`` is ignored so that
  ``ulimit -f`` shows as "file too large"), a JAX platform that cannot start (``JAX_PLATFORMS=tpu`` without one) and a
  malformed ``XLA_FLAGS`` (its syntax, and its flags and values as XLA reads them, checked before JAX starts: XLA
  aborts with a 90-line fatal error otherwise). Ctrl-C is one line and exit 130; when ``main`` runs as the command
  (``argv`` None), further Ctrl-C are ignored and the process ends at once (``os._exit`` after flushing stdout,
  once every ``finally`` and ``with`` has run: the interpreter's shutdown with JAX's threads mid-step could
  segfault, and JAX's atexit hooks printed "Exception ignored in atexit callback" on a second Ctrl-C); called from
  Python with an ``argv``, 130 is returned and the handler restored (a child process would otherwise inherit an
  ignored SIGINT). A closed stdout (``mia-jax ... | head -1``) ends the command quietly, status 141 (128 + SIGPIPE).
  Anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import argparse
import atexit
import errno
import functools
import importlib.util
import os
import re
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from mia_jax.runs import preemption
from mia_jax.errors import UserError

# OSErrors that describe the user's machine or paths, not a bug: reported in one line
USER_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EISDIR,
               errno.EEXIST, errno.ELOOP, errno.ENAMETOOLONG, errno.EFBIG, errno.ENOENT, errno.EMFILE}
FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}  # a full disk or a file-size limit
_XLA_FLAG = re.compile(r"--[A-Za-z0-9_]+(=\S*)?")


class ArgumentParser(argparse.ArgumentParser):
    """argparse with one-line usage errors (exit 2); subparsers are of the same class."""

    def error(self, message: str):
        """Print ``message`` as one line naming the program and --help, and exit with status 2."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _number(kind, low, strict: bool, name: str):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {'whole ' if kind is int else ''}number") from None
        if value != value or value in (float("inf"), float("-inf")) or (value <= low if strict else value < low):
            bound = f"at least {low + 1}" if strict and kind is int else f"{'>' if strict else '>='} {low}"
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text}")
        return value

    parse.__name__ = name
    return parse


positive_int = _number(int, 0, True, "positive_int")
nonneg_int = _number(int, 0, False, "nonneg_int")
positive_float = _number(float, 0.0, True, "positive_float")
nonneg_float = _number(float, 0.0, False, "nonneg_float")


def fraction(text: str) -> float:
    """A number in (0, 1]."""
    try:
        value = positive_float(text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"{e} (a fraction in (0, 1])") from None
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be a fraction in (0, 1], got {text}")
    return value


def input_file(text: str) -> Path:
    """An existing, readable file (not a folder)."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; give a file")
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text} is not readable")
    return path


def input_dir(text: str) -> Path:
    """An existing folder."""
    path = Path(text)
    if path.is_file():
        raise argparse.ArgumentTypeError(f"{text} is a file; give a folder")
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: no such folder")
    return path


class source_dir:  # noqa: N801 - used like a type
    """The ``--from`` folder of a rebuild: an existing folder written by ``kind``; ``example`` names a committed
    folder of that kind (the fuzz test corrupts a copy of it)."""

    def __init__(self, kind: str, example: str | None = None):
        self.kind, self.example = kind, example
        self.__name__ = "source_dir"

    def __call__(self, text: str) -> Path:
        path = input_dir(text)
        if not any(path.iterdir()):
            raise argparse.ArgumentTypeError(f"{text} is empty; give the folder a {self.kind} run wrote")
        return path


def check_out(path: str | os.PathLike, flag: str = "--out") -> Path:
    """An output folder that can be made: not a file, not under a file, not a dangling link, its nearest existing
    parent writable. Creates nothing."""
    path = Path(path)
    if path.is_symlink() and not path.exists():
        raise UserError(f"{flag} {path} is a link to a missing {os.readlink(path)}; remove it or give another folder")
    if path.exists():
        if not path.is_dir():
            raise UserError(f"{flag} {path} is an existing file, not a folder; give a folder path")
        if not os.access(path, os.W_OK | os.X_OK):
            raise UserError(f"{flag} {path} is not writable")
        return path
    parent = path.absolute().parent
    while not parent.exists() and not parent.is_symlink():
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"{flag} {path} is under {parent}, which is a file or a broken link, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {path} cannot be made: {parent} is not writable")
    return path


def out_dir(text: str) -> Path:
    """argparse type of ``--out`` folders (``check_out`` at parse time)."""
    try:
        return check_out(text)
    except UserError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--out ")) from None


# a folder holding one of these is a run's (or a model's): an output file is never written into it
RUN_FILES = ("config.json", "manifest.json", "run.json", ".lock")


def out_file(text: str) -> Path:
    """argparse type of an output file (a report, ``--json``): not a folder, not a dangling link, in an existing,
    writable folder that is not a run's or a model's (one holding any of :data:`RUN_FILES`: a report written there
    could replace a file the run recorded); checked at parse time, before anything runs."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder; give a file path")
    if path.is_symlink() and not path.exists():
        raise argparse.ArgumentTypeError(f"{text} is a link to a missing {os.readlink(path)}")
    parent = path.absolute().parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: its folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text}: its folder {parent} is not writable")
    held = next((name for name in RUN_FILES if (parent / name).exists()), None)
    if held:
        raise argparse.ArgumentTypeError(f"{text}: its folder {parent} holds a run or a model ({held}), whose files "
                                         "a report must not replace; write it elsewhere")
    return path


def check_xla_flags() -> None:
    """Refuse a malformed ``XLA_FLAGS`` before JAX starts (XLA aborts the process with a 90-line fatal error): its
    syntax here, then its flags and values as XLA parses them (:func:`_xla_refusal`)."""
    flags = os.environ.get("XLA_FLAGS", "")
    bad = [t for t in flags.split() if not _XLA_FLAG.fullmatch(t)]
    if bad:
        raise UserError(f"XLA_FLAGS holds {bad[0]!r}, which is not a --name or --name=value flag; fix or unset "
                        "XLA_FLAGS")
    reason = _xla_refusal(flags) if flags.strip() else None
    if reason:
        raise UserError(f"XLA_FLAGS: XLA refuses it ({reason}); fix or unset XLA_FLAGS")


@functools.lru_cache(maxsize=8)
def _xla_refusal(flags: str) -> str | None:
    """XLA's first complaint about ``flags`` (a value it cannot read, a flag it does not know), found by a CPU client
    made in a child process (about 0.1 s, once per process and value); None when XLA takes them, when this process's
    backends have already started (they took them) or when the check cannot run. A flag unknown to the CPU build is
    left to the TPU runtime where one is installed (``libtpu``) or where it names TPU."""
    bridge = sys.modules.get("jax._src.xla_bridge")  # private; not imported here (JAX not loaded: not started)
    if bridge is not None and getattr(bridge, "backends_are_initialized", lambda: False)():
        return None
    code = "from jaxlib import xla_client; xla_client.make_cpu_client()"
    try:
        done = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, XLA_FLAGS=flags),
                              capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode == 0:
        return None
    found = re.search(r"\] (Couldn't interpret value .*|Unknown flag in XLA_FLAGS: .*)$", done.stderr, re.M)
    if not found:
        return None
    if "Unknown flag" in found.group(1) and ("tpu" in found.group(1) or importlib.util.find_spec("libtpu")):
        return None  # the TPU runtime registers flags of its own that the CPU build does not know
    return found.group(1).strip().rstrip(".")


def describe_os_error(e: OSError) -> str:
    """The one line for an ``OSError`` a user can fix: what could not be used or written, the system's reason, and
    for a full disk that the same command resumes."""
    full = e.errno in FULL_ERRNOS
    where = f" {e.filename}" if e.filename else ""
    text = f"cannot {'write' if full else 'use'}{where}: {e.strerror or e}"
    if full:
        text += "; free some space (or raise the limit) and run the same command again: finished work is kept"
    return text


_PRESSED = False  # Ctrl-C was pressed while remember_sigint (or the command's guard) held SIGINT


def check_interrupted() -> None:
    """Raise KeyboardInterrupt if Ctrl-C was pressed while SIGINT was remembered (even if its raise was swallowed:
    Python drops an exception raised inside a garbage-collection callback)."""
    if _PRESSED:
        raise KeyboardInterrupt


def _on_sigint(signum, frame):
    """The first Ctrl-C raises and is remembered; later ones return: raised while the first unwinds, they landed in
    JAX's callbacks as "Exception ignored in ..." tracebacks."""
    global _PRESSED
    if _PRESSED:
        return
    _PRESSED = True
    raise KeyboardInterrupt


@contextmanager
def remember_sigint() -> Iterator[None]:
    """Within the block, SIGINT is :func:`_on_sigint` (raised once, remembered for :func:`check_interrupted`);
    the default handler and a clear memory after it. Left alone off the main thread, under the command's guard
    (already :func:`_on_sigint`) and where the caller installed a handler of its own."""
    global _PRESSED
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not \
            signal.default_int_handler:
        yield
        return
    _PRESSED = False
    signal.signal(signal.SIGINT, _on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _PRESSED = False


@contextmanager
def sigint_deferred() -> Iterator[None]:
    """Within the block a Ctrl-C is held and acted on at its end (by the handler it replaced): for the import of
    compiled extensions, which a KeyboardInterrupt raised inside leaves half-initialised (jaxlib then segfaulted)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pressed: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pressed.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if pressed and previous is not signal.SIG_IGN:
        if callable(previous):
            previous(signal.SIGINT, None)
        raise KeyboardInterrupt


def _quiet_exit():
    """Ignore further Ctrl-C while the interpreter shuts down (JAX's atexit hooks would print a traceback); returns
    the handler it replaced (None off the main thread)."""
    try:
        return signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread
        return None


def exit_now(status: int):
    """End the process with ``status`` as ``sys.exit`` would, less the interpreter's teardown: the ``atexit`` hooks
    run and stdout and stderr are flushed, then ``os._exit``. The teardown (every module and JAX's client freed one
    by one) took 0.6 s at the end of each ``mia-jax eval`` on the CPU. A thread other than the main one still alive
    and not a daemon gets the normal exit, which waits for it. For a command's process only: never returns."""
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(status)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (``| head``) or stream: nothing left to deliver
            pass
    os._exit(status)


def run(prog: str, main: Callable[..., int | None], argv: list[str] | None = None, *,
        resume_hint: str | Callable[[], str] = "") -> int:
    """Run ``main(argv)`` under the guard; returns the exit status (0, 2 for a user error, 130 for Ctrl-C,
    ``preemption.EXIT_CODE`` (75) after a preemption notice, 1 when another process of a multi-process run was
    lost; argparse's own exits, ``--help`` and usage errors, as their status). ``resume_hint``: what to do after
    Ctrl-C (a string, or a function giving it when the interrupt comes)."""
    if hasattr(signal, "SIGXFSZ"):
        try:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        except ValueError:
            pass
    if argv is None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _on_sigint)  # the command: Ctrl-C raised once, from start-up on
        preemption.install()  # the command: SIGTERM is a preemption notice, acted on at a step boundary
    try:
        check_xla_flags()
        status = main(argv) or 0
        sys.stdout.flush()  # output held in the buffer meets a closed pipe here, under the guard
        return status
    except BrokenPipeError:  # stdout's reader left (``| head``): the Python docs' "Note on SIGPIPE"
        try:  # what is still buffered goes to os.devnull, not to a second error at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):  # a stdout without a file descriptor (a test's capture)
            pass
        return 141  # 128 + SIGPIPE: what a shell shows for a process a closed pipe ended (``yes | head``)
    except preemption.Preempted as e:
        print(f"{prog}: {e}", file=sys.stderr, flush=True)
        return preemption.EXIT_CODE
    except SystemExit as e:  # argparse: --help (0) and usage errors (2, one line already printed)
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        message = str(e.code)
    except UserError as e:
        message = str(e)
    except KeyboardInterrupt:
        previous = _quiet_exit()
        hint = resume_hint() if callable(resume_hint) else resume_hint
        print(f"{prog}: interrupted{'; ' + hint if hint else ''}", file=sys.stderr, flush=True)
        if argv is not None and previous is not None:  # called from Python (a test, a notebook): not exiting
            signal.signal(signal.SIGINT, previous)
        if argv is None:  # the command: no interpreter shutdown with JAX's threads mid-step (it can segfault)
            sys.stdout.flush()
            os._exit(130)
        return 130
    except OSError as e:
        if e.errno not in USER_ERRNOS:
            raise
        if e.errno in FULL_ERRNOS and "mia_jax.engine.compilation" in sys.modules:  # loaded: JAX may have cut an entry
            sys.modules["mia_jax.engine.compilation"].drop_entries_written()
        message = describe_os_error(e)
    except (RuntimeError, ValueError) as e:
        if preemption.lost_process(e):
            print(f"{prog}: error: {preemption.lost_line(e)}", file=sys.stderr, flush=True)
            if argv is None:  # the command: not JAX's exit barrier, which would wait for the lost process and abort
                sys.stdout.flush()
                os._exit(1)
            return 1
        if not isinstance(e, RuntimeError) or not str(e).startswith("Unable to initialize backend"):
            raise
        message = (f"JAX cannot start the platform asked for ({os.environ.get('JAX_PLATFORMS') or 'default'}): "
                   f"{str(e).splitlines()[0]}; set JAX_PLATFORMS to one this machine has (e.g. cpu)")
    print(f"{prog}: error: {' '.join(message.split())}", file=sys.stderr, flush=True)
    return 2
