"""Runs the kvq Python binding tests and ends with the line
"N passed, N failed" (exit status 1 when anything failed), as every kvq
test program does.

    KVQ_LIB=build/libkvq.so /usr/bin/python3 python/tests/run.py [-q] [unittest names...]

Without numpy the binding cannot run: that is a failure ("0 passed, 1
failed", exit 1), as is a test that skips itself (no shared data, no C
compiler), unless the environment sets KVQ_ALLOW_SKIP=1 to skip what cannot
run here: the reason is then printed as SKIPPED and the run passes. `make
check` (and so CI) never sets it. A missing library is a failure.
"""

import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))


class CountingResult(unittest.TextTestResult):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.passed = 0

    def addSuccess(self, test):
        super().addSuccess(test)
        self.passed += 1


def main(argv):
    quiet = "-q" in argv
    names = [a for a in argv if a != "-q"]
    allow_skip = os.environ.get("KVQ_ALLOW_SKIP") == "1"
    try:
        import numpy  # noqa: F401
    except ImportError:
        why = ("numpy is not installed for %s (Debian: apt-get install python3-numpy); "
               "the kvq Python binding needs it" % sys.executable)
        if allow_skip:
            print("SKIPPED: %s (KVQ_ALLOW_SKIP=1)" % why)
            print("0 passed, 0 failed")
            return 0
        print("FAIL: %s (KVQ_ALLOW_SKIP=1 skips instead)" % why)
        print("0 passed, 1 failed")
        return 1
    sys.path.insert(0, HERE)
    loader = unittest.defaultTestLoader
    if names:
        suite = loader.loadTestsFromNames(names)
    else:
        suite = loader.discover(HERE, pattern="test_*.py", top_level_dir=HERE)
    runner = unittest.TextTestRunner(stream=sys.stdout, verbosity=1 if quiet else 2,
                                     resultclass=CountingResult)
    result = runner.run(suite)
    # failures count failed checks (each failing subTest, a failing
    # setUpModule); passes count tests that ran with every check passing
    failed = len(result.failures) + len(result.errors) + len(result.unexpectedSuccesses)
    passed = result.passed + len(result.expectedFailures)
    for test, reason in result.skipped:
        if allow_skip:
            print("SKIPPED: %s: %s (KVQ_ALLOW_SKIP=1)" % (test, reason))
        else:
            print("FAIL: %s skipped: %s (KVQ_ALLOW_SKIP=1 skips instead)" % (test, reason))
            failed += 1
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
