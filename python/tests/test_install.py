"""The package installs offline with pip (pyproject.toml, setuptools, no
build isolation) and the installed copy finds libkvq: through KVQ_LIB,
through the system loader (libkvq.so.0 on LD_LIBRARY_PATH, as after `make
install`), and says what it tried when there is none. Run from the clone
(python/ on sys.path) it takes the clone's build/libkvq.so, even when a
system library is there too.
"""

import ctypes
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))

import kvq  # noqa: E402

PROBE = ("import kvq, numpy as np\n"
         "lib = kvq.load()\n"
         "c = kvq.Codec('f32', 4)\n"
         "assert (c.decode(c.encode(np.arange(4, dtype=np.float32))) == np.arange(4)).all()\n"
         "print(lib.found_by, lib.path, kvq.__file__)\n")


def system_has_libkvq():
    try:
        ctypes.CDLL("libkvq.so.0")
        return True
    except OSError:
        return False


class TestInstall(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="kvq-pip-")
        cls.lib = kvq.load().path  # the library these tests run against

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_py(self, code, cwd, **env):
        e = {k: v for k, v in os.environ.items()
             if k not in ("KVQ_LIB", "PYTHONPATH", "LD_LIBRARY_PATH")}
        e.update(env)
        return subprocess.run([sys.executable, "-c", code], cwd=cwd, env=e, capture_output=True,
                              text=True)

    def test_pip_install_and_find_library(self):
        try:
            import pip  # noqa: F401
        except ImportError:
            self.skipTest("pip is not installed for %s (Debian: apt-get install python3-pip "
                          "python3-setuptools)" % sys.executable)
        # install from a copy, so the build leaves nothing in the clone
        src = os.path.join(self.tmp, "src")
        shutil.copytree(os.path.join(REPO, "python"), src,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
        target = os.path.join(self.tmp, "site")
        out = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation",
                              "--no-index", "--no-deps", "--quiet", "--target", target, src],
                             capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertTrue(os.path.exists(os.path.join(target, "kvq", "_arrays.py")))
        self.assertFalse(os.path.exists(os.path.join(target, "tests")))
        away = os.path.join(self.tmp, "elsewhere")
        os.makedirs(away)
        # KVQ_LIB first
        r = self.run_py(PROBE, away, PYTHONPATH=target, KVQ_LIB=self.lib)
        self.assertEqual(r.returncode, 0, r.stderr)
        how, path, init = r.stdout.split()
        self.assertEqual((how, path), ("KVQ_LIB", self.lib))
        self.assertTrue(init.startswith(target), init)  # the installed copy, not the clone's
        # the system loader: libkvq.so.0 as `make install` names it
        libdir = os.path.join(self.tmp, "lib")
        os.makedirs(libdir)
        shutil.copy(self.lib, os.path.join(libdir, "libkvq.so.0"))
        so0 = os.path.join(libdir, "libkvq.so.0")
        r = self.run_py(PROBE, away, PYTHONPATH=target, LD_LIBRARY_PATH=libdir)
        self.assertEqual(r.returncode, 0, r.stderr)
        how, path, _ = r.stdout.split()
        self.assertEqual(how, "system")
        # loaded by path first, the loader hands back that library for its
        # soname: load() gives the same Lib, not a second one
        same = ("import kvq\nlib = kvq.load(%r)\nassert kvq.load() is lib, kvq.load().path\n"
                "print('ok')\n" % so0)
        r = self.run_py(same, away, PYTHONPATH=target, LD_LIBRARY_PATH=libdir)
        self.assertEqual((r.returncode, r.stdout.strip()), (0, "ok"), r.stderr)
        if not system_has_libkvq():
            self.assertEqual(path, so0)
            # and none at all: an error that says what was tried and what to do
            r = self.run_py(PROBE, away, PYTHONPATH=target)
            self.assertNotEqual(r.returncode, 0)
            for text in ("libkvq not found", "KVQ_LIB", "libkvq.so.0", "make install",
                         "installed at"):
                self.assertIn(text, r.stderr)
        # a KVQ_LIB that does not exist is an error, not a silent fallback
        r = self.run_py(PROBE, away, PYTHONPATH=target, KVQ_LIB=os.path.join(away, "nope.so"))
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("from KVQ_LIB", r.stderr)

    def test_from_the_clone(self):
        if not os.path.exists(os.path.join(REPO, "build", "libkvq.so")):
            self.skipTest("no build/libkvq.so in this clone (tests run against %s)" % self.lib)
        # a system libkvq.so.0 (here: a copy on LD_LIBRARY_PATH) does not
        # shadow the clone's own build
        libdir = os.path.join(self.tmp, "syslib")
        os.makedirs(libdir, exist_ok=True)
        shutil.copy(self.lib, os.path.join(libdir, "libkvq.so.0"))
        r = self.run_py(PROBE, self.tmp, PYTHONPATH=os.path.join(REPO, "python"),
                        LD_LIBRARY_PATH=libdir)
        self.assertEqual(r.returncode, 0, r.stderr)
        how, path, _ = r.stdout.split()
        self.assertEqual((how, path), ("clone", os.path.join(REPO, "build", "libkvq.so")))


if __name__ == "__main__":
    unittest.main()
