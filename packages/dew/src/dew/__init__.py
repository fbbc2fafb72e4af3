"""Dew: post-training for JAX models.

``dew`` is one import namespace spread over several distributions (``dew``,
``dew-rl``, ``dew-sandbox`` ...). Extending ``__path__`` lets the other
distributions' subpackages be found whether they are installed as wheels into
one site-packages or as editable workspace members on separate paths.
"""

from pkgutil import extend_path

from dew.lazy import lazy_exports

__path__ = extend_path(__path__, __name__)

__version__ = "0.1.0"

# Lazy, so that `import dew.rl` alone stays light.
__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "Trainer": "dew.trainer",
        "Dataset": "dew.data",
        "models": "dew.models",
    },
)
