"""Dew: post-training for JAX models.

``dew`` is one import namespace spread over several distributions (``dew``,
``dew-rl``, ``dew-sandbox`` ...). Extending ``__path__`` lets the other
distributions' subpackages be found whether they are installed as wheels into
one site-packages or as editable workspace members on separate paths.
"""

from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)

__version__ = "0.1.0"

_LAZY = {
    "Trainer": "dew.trainer",
    "TrainState": "dew.trainer",
    "Dataset": "dew.data",
    "Loading": "dew.data",
}


def __getattr__(name: str):  # lazy, so `import dew.rl` alone stays light
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    if name == "models":
        import importlib

        return importlib.import_module("dew.models")
    raise AttributeError(f"module 'dew' has no attribute {name!r}")
