"""Test setup shared by every suite of the workspace (pytest loads this file first, from the
root, for tests under ``tests/`` and ``packages/*/tests``).

JAX's persistent compilation cache is on in tests, in a fresh temporary directory per test
session (``DEW_COMPILE_CACHE=1`` and ``DEW_COMPILE_CACHE_DIR``, inherited by the xdist
workers and by every subprocess a test starts), never the user's ``~/.cache/dew/jax``: the
many ``dew train`` processes of a suite build the same small programs, and a process that
finds one compiled by another skips its compile (a cached executable is the same program and
trains bit-identically: ``packages/dew/tests/test_compile_cache.py``). The directory is made
by the session's first process (the xdist controller, or the one process of a serial run) and
removed when that process exits.

``JAX_COMPILATION_CACHE_MAX_SIZE`` is set (far above what a session writes) because only a
size-bounded JAX cache takes its file lock around each read and write: JAX writes an entry in
place, so without the lock a process could read one that another is still writing. A test of
the cache itself passes its own directory and strips these variables from its processes
(``packages/dew/tests/test_compile_cache.py``).
"""

import atexit
import os
import shutil
import tempfile

#: Set by the process that made the session's cache directory (its pid), so that the xdist
#: workers and the subprocesses of tests, which load this file again, keep that directory.
OWNER = "DEW_TEST_COMPILE_CACHE_OWNER"
#: 64 GiB: never reached by a test session, so nothing is evicted.
MAX_SIZE = str(64 << 30)

if not os.environ.get(OWNER) or not os.path.isdir(os.environ.get("DEW_COMPILE_CACHE_DIR", "")):
    _directory = tempfile.mkdtemp(prefix="dew-test-jax-cache-")
    atexit.register(shutil.rmtree, _directory, ignore_errors=True)
    os.environ[OWNER] = str(os.getpid())
    os.environ["DEW_COMPILE_CACHE_DIR"] = _directory
os.environ["DEW_COMPILE_CACHE"] = "1"
os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"] = MAX_SIZE
os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)  # the user's own JAX cache: not in tests
