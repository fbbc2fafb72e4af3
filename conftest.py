"""Test setup shared by every suite of the workspace (pytest loads this file first, from the
root, for tests under ``tests/`` and ``packages/*/tests``).

JAX's persistent compilation cache stays off in tests (``DEW_COMPILE_CACHE=0``, inherited by
every subprocess a test starts): the ``Trainer`` and the ``dew`` command line would otherwise
write compiled programs into the user's ``~/.cache/dew/jax``. A test of the cache passes its
own directory and turns it on explicitly (``packages/dew/tests/test_compile_cache.py``).
"""

import os

os.environ["DEW_COMPILE_CACHE"] = "0"
