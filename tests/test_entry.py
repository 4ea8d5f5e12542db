"""The guard of every entry point (mia_jax.entry): which failures become one line and exit 2, which stay bugs."""
import errno
import signal

import pytest
from helpers import assert_clean_error

from mia_jax import entry
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


def test_ctrl_c_is_one_line_and_later_presses_are_ignored(capsys):
    """As the command (argv None) later presses are ignored while the process exits; called from Python with an
    argv, the handler is given back (children would inherit an ignored SIGINT)."""
    try:
        assert entry.run("prog", _raising(KeyboardInterrupt()), None, resume_hint=lambda: "run it again") == 130
        assert capsys.readouterr().err == "prog: interrupted; run it again\n"
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN  # a second Ctrl-C while JAX shuts down
        signal.signal(signal.SIGINT, signal.default_int_handler)
        assert entry.run("prog", _raising(KeyboardInterrupt()), []) == 130
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
                                        ("--a=1 --b", True), ("xla_foo=1", False), ("--a=1 -b", False)])
def test_xla_flags_syntax(flags, ok, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", flags)
    if ok:
        entry.check_xla_flags()
    else:
        with pytest.raises(UserError, match="XLA_FLAGS"):
            entry.check_xla_flags()


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
