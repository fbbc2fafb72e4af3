"""Canvas generation for masked-diffusion models: a fixed-length canvas whose masked
positions are filled over a number of steps (MDLM's ancestral sampler or LLaDA's
low-confidence remasking), block by block, in one compiled loop.

- `Canvas`: the strategy, steps, blocks and mask id (`config`);
- `CanvasGeneration`, `CanvasOutput`: a bound model that fills canvases (`generation`);
- `NotAutoregressive`, `refuse_canvas`: what the RL rollouts raise when handed one;
- `updates` (one step as array math) and `loop` (the compiled loop) underneath.
"""

from dew.inference.canvas.config import Canvas, NotAutoregressive, refuse_canvas
from dew.inference.canvas.generation import CanvasGeneration, CanvasOutput

__all__ = ["Canvas", "CanvasGeneration", "CanvasOutput", "NotAutoregressive", "refuse_canvas"]
