"""Inference on Dew decoders: `TextGeneration` (one compiled sampling loop per call)
and `Server` (continuous batching over fixed cache slots)."""

from dew.inference.generation import Generation, TextGeneration
from dew.inference.server import Completion, RequestTooLarge, Server

__all__ = ["Completion", "Generation", "RequestTooLarge", "Server", "TextGeneration"]
