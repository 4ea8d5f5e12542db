"""The guard of every entry point (mia_jax.runs.entry): which failures become one line and exit 2, which stay bugs."""
import errno
import signal
import subprocess
import sys

import pytest
from helpers import ENV, assert_clean_error

from mia_jax.runs import entry
from mia_jax.errors import UserError


def _raising(exc):
    def main(argv):
        raise exc

    return main


@pytest.mark.parametrize("exc, needle", [
    (OSError(errno.EROFS, "Read-only file system", "/ro/out"), "cannot use /ro/out: Read-only file system"),
    (OSError(errno.ENOSPC, "No space left on device", "/x/passes/main.jsonl"), "run the same command again"),
    (OSError(errno.EFBIG, "File too large"), "cannot write: File too large"),
    (PermissionError(errno.EACCES, "Permission denied", "/root/x"), "Permission denied"),
    (NotADirectoryError(errno.ENOTDIR, "Not a directory", "/a/file/sub"), "/a/file/sub"),
    (UserError("bad thing\non two lines"), "bad thing on two lines"),
    (RuntimeError("Unable to initialize backend 'tpu': not found\nmore"), "JAX_PLATFORMS"),
])
def test_user_failures_are_one_line_and_exit_2(exc, needle, capsys):
    assert_clean_error(entry.run("prog", _raising(exc), []), capsys.readouterr().err, "prog: error: ", needle)


@pytest.mark.parametrize("exc", [OSError(errno.EBADF, "Bad file descriptor"), RuntimeError("a bug"),
                                 ValueError("a bug")])
def test_bugs_keep_their_traceback(exc):
    with pytest.raises(type(exc)):
        entry.run("prog", _raising(exc), [])


def test_flags_xla_for_cpu_does_not_know_are_left_to_an_installed_tpu_runtime(tmp_path):
    """Where libtpu is installed (here a stand-in on PYTHONPATH), a flag the CPU build does not know may be the TPU
    runtime's: not refused; a value XLA cannot read still is."""
    (tmp_path / "libtpu").mkdir()
    (tmp_path / "libtpu" / "__init__.py").write_text("")
    env = ENV | {"PYTHONPATH": str(tmp_path)}
    for flags, refused in (("--xla_enable_async_all_gather=true", False),
                           ("--xla_force_host_platform_device_count=abc", True)):
        done = subprocess.run([sys.executable, "-m", "mia_jax.cli", "score", "--help"], capture_output=True,
                              text=True, env=env | {"XLA_FLAGS": flags}, timeout=300, cwd=tmp_path)
        assert (done.returncode, "XLA refuses it" in done.stderr) == ((2, True) if refused else (0, False)), done.stderr


def test_ctrl_c_is_one_line_and_the_command_exits_at_once():
    """As the command (argv None): one line, stdout flushed, exit 130 straight away (os._exit: no interpreter
    shutdown with JAX's threads mid-step, which segfaulted at times, and no atexit hook to catch a second Ctrl-C)."""
    code = ("import sys; from mia_jax.runs import entry\n"
            "def main(argv):\n    print('half a report', end='')\n    raise KeyboardInterrupt\n"
            "import atexit; atexit.register(lambda: print('atexit ran', file=sys.stderr))\n"
            "sys.exit(entry.run('prog', main, resume_hint=lambda: 'run it again'))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)
    assert done.returncode == 130
    assert done.stdout == "half a report" and done.stderr == "prog: interrupted; run it again\n"


@pytest.mark.parametrize("end, thread", [("entry.exit_now(3)", False), ("sys.exit(3)", False),
                                         ("entry.exit_now(3)", True)])
def test_exit_now_runs_the_exit_hooks_but_not_the_teardown(end, thread):
    """``entry.exit_now`` (how the ``mia-jax`` console script ends): the status, stdout and stderr flushed, the
    atexit hooks run, but not the interpreter's teardown (a module object's finalizer, which ``sys.exit`` runs,
    does not run); with a thread still working that is not a daemon, the normal exit, after the thread."""
    code = ("import atexit, sys, threading, time; from mia_jax.runs import entry\n"
            "class Held:\n    def __del__(self):\n        print('teardown', file=sys.stderr, flush=True)\n"
            "held = Held()\n"
            "atexit.register(lambda: print('atexit ran', file=sys.stderr))\n"
            f"if {thread}:\n"
            "    threading.Thread(target=lambda: time.sleep(1) or print('thread done', end='')).start()\n"
            f"print('report', end='')\n{end}\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)
    assert done.returncode == 3
    assert done.stdout == "report" + ("thread done" if thread else "")
    teardown = end == "sys.exit(3)" or thread
    assert done.stderr == "atexit ran\n" + ("teardown\n" if teardown else ""), done.stderr


def test_the_command_guards_ctrl_c_before_jax_loads():
    """``mia-jax``'s module loads no JAX (``mia_jax`` names its API lazily), so the guard is in place before the
    slow imports (a Ctrl-C there was a 40-line traceback); as the command, SIGINT is raised once from the start."""
    code = ("import sys, signal; import mia_jax.cli; from mia_jax.runs import entry\n"
            "print('jax' in sys.modules)\n"
            "sys.exit(entry.run('prog', lambda argv: print(signal.getsignal(signal.SIGINT) is entry._on_sigint)))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)
    assert done.returncode == 0 and done.stdout.split() == ["False", "True"], done.stderr


def test_ctrl_c_called_from_python_returns_and_gives_the_handler_back(capsys):
    """Called from Python with an argv (a test, a notebook): 130 returned, not exited, and SIGINT's handler given
    back (children would inherit an ignored SIGINT)."""
    try:
        assert entry.run("prog", _raising(KeyboardInterrupt()), []) == 130
        assert capsys.readouterr().err == "prog: interrupted\n"
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def test_argparse_exits_become_statuses(capsys):
    parser = entry.ArgumentParser(prog="prog")
    parser.add_argument("--n", type=entry.positive_int, required=True)

    def main(argv):
        parser.parse_args(argv)

    assert entry.run("prog", main, ["--help"]) == 0
    capsys.readouterr()
    assert_clean_error(entry.run("prog", main, ["--n", "0"]), capsys.readouterr().err,
                       "argument --n: must be at least 1, got 0 (see prog --help)")


@pytest.mark.parametrize("flags, ok", [("", True), ("--xla_force_host_platform_device_count=8", True),
                                        ("xla_foo=1", False), ("--a=1 -b", False)])
def test_xla_flags_syntax(flags, ok, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", flags)
    if ok:
        entry.check_xla_flags()
    else:
        with pytest.raises(UserError, match="not a --name or --name=value flag"):
            entry.check_xla_flags()


@pytest.mark.parametrize("flags, needle", [
    ("--xla_force_host_platform_device_count=abc", "Couldn't interpret value abc for flag "
                                                   "xla_force_host_platform_device_count"),
    ("--xla_force_host_platform_device_count=2 --xla_no_such_flag=1",
     "Unknown flag in XLA_FLAGS: --xla_no_such_flag=1"),
    ("--xla_gpu_autotune_level=2 --xla_dump_to=/tmp/x", None),  # GPU flags are XLA's too: taken
    ("--xla_tpu_enable_latency_hiding_scheduler=true", None),  # unknown to the CPU build: left to the TPU runtime
])
def test_xla_flags_values_as_xla_reads_them(flags, needle, tmp_path):
    """A well-formed flag XLA cannot read (a bad value, an unknown name) is one line and exit 2 in a fresh process
    (XLA's own 94-line fatal otherwise); flags it takes start the command."""
    done = subprocess.run([sys.executable, "-m", "mia_jax.cli", "score", "--help"], capture_output=True, text=True,
                          env=ENV | {"XLA_FLAGS": flags}, timeout=300, cwd=tmp_path)
    if needle is None:
        assert done.returncode == 0 and "usage" in done.stdout, done.stderr
    else:
        assert_clean_error(done.returncode, done.stderr, "mia-jax: error: XLA_FLAGS: XLA refuses it", needle)
    assert list(tmp_path.iterdir()) == []


def test_check_out(tmp_path):
    (tmp_path / "f").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "missing")
    assert entry.check_out(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists()  # nothing made
    for bad, needle in [("f", "existing file"), ("f/sub", "is under"), ("link", "link to a missing")]:
        with pytest.raises(UserError, match=needle):
            entry.check_out(tmp_path / bad)


@pytest.mark.parametrize("parse, text", [(entry.positive_int, "0"), (entry.nonneg_int, "-1"),
                                         (entry.positive_float, "nan"), (entry.nonneg_float, "-inf"),
                                         (entry.fraction, "1.01"), (entry.fraction, "0")])
def test_number_types_refuse(parse, text):
    with pytest.raises(Exception, match="must be|fraction"):
        parse(text)


def test_number_types_accept():
    assert entry.positive_int("3") == 3 and entry.nonneg_int("0") == 0 and entry.fraction("1") == 1.0
    assert entry.positive_float("1e-5") == 1e-5 and entry.nonneg_float("0") == 0.0


@pytest.mark.parametrize("argv, unbuffered, status", [(["datasets", "list"], "1", 141), (["datasets", "list"], "", 141),
                                                      (["eval", "--help"], "1", 0), (["--help"], "", 0)])
def test_a_closed_stdout_ends_the_command_quietly(argv, unbuffered, status, tmp_path):
    """`mia-jax ... | head -1` with head gone before the first line: the reader of a real pipe closed before the
    command writes. Each line written at once (PYTHONUNBUFFERED) or held in the buffer until the end: no traceback,
    nothing on stderr, status 141 (128 + SIGPIPE), as `yes | head` shows in a shell; --help keeps argparse's status,
    0 (argparse drops its own write errors), the help dropped as quietly at exit."""
    env = ENV | {"PYTHONUNBUFFERED": unbuffered, "TFDS_DATA_DIR": str(tmp_path)}
    done = subprocess.Popen([sys.executable, "-m", "mia_jax.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    done.stdout.close()
    err = done.stderr.read()
    assert (done.wait(timeout=300), err) == (status, "")


def test_piped_into_head(tmp_path):
    """The shell pipe users type: the first line comes through, no traceback whenever head leaves."""
    command = f"{sys.executable} -m mia_jax.cli datasets list --data-dir {tmp_path} | head -1"
    done = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True, env=ENV,
                          timeout=300, cwd=tmp_path)
    assert done.returncode in (0, 141) and done.stderr == ""
    assert done.stdout == f"tfds:wikimia/length32\tnot built in {tmp_path}\n"
