"""Lets `python manage.py test [labels]` run the pytest suite (pytest-django's documented recipe).

With no labels, the whole suite in two passes: the in-process tier on every core (pytest-xdist), then
the live tiers one test at a time: the servers they start, and the soak, need those cores
(docs/decisions.md, "`make test-fast` under a minute")."""

import sys

IN_PROCESS = "not live and not heavy and not deploy"  # the tier of `make test-fast` (pytest.ini)


class PytestTestRunner:
    def __init__(self, verbosity=1, failfast=False, keepdb=False, **kwargs):
        self.verbosity = verbosity
        self.failfast = failfast
        self.keepdb = keepdb

    @classmethod
    def add_arguments(cls, parser):
        parser.add_argument("--keepdb", action="store_true", help="Preserve the test DB between runs.")

    def run_tests(self, test_labels, **kwargs):
        argv = []
        if self.verbosity == 0:
            argv.append("--quiet")
        elif self.verbosity >= 2:
            argv.append("-" + "v" * (self.verbosity - 1))
        if self.failfast:
            argv.append("--exitfirst")
        if self.keepdb:
            argv.append("--reuse-db")
        if test_labels:
            return self._run([*argv, *test_labels])
        in_process = self._run([*argv, "-n", "auto", "-m", IN_PROCESS])
        live = self._run([*argv, "-m", f"not ({IN_PROCESS})"])
        return in_process or live

    @staticmethod
    def _run(argv):
        import pytest

        code = int(pytest.main(argv))
        sys.stdout.flush()
        return code
