"""Dew: post-training for JAX models.

``dew`` is one import namespace spread over several distributions (``dew``,
``dew-rl``, ``dew-sandbox`` ...). Extending ``__path__`` lets the other
distributions' subpackages be found whether they are installed as wheels into
one site-packages or as editable workspace members on separate paths.
"""

from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)

__version__ = "0.1.0"
