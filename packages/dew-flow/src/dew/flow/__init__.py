"""dew.flow: rectified-flow models, flow matching and Flow-GRPO on the dew Trainer.

Names resolve lazily, so ``import dew.flow`` stays light until one is used.
"""

from dew.lazy import lazy_exports

__version__ = "0.1.0"

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "Field": "dew.flow.inputs",
        "InputSpec": "dew.flow.inputs",
        "InputError": "dew.flow.inputs",
        "Process": "dew.flow.process",
        "transition_kl": "dew.flow.process",
        "coordinate_log_density": "dew.flow.process",
        "SimpleDiT": "dew.flow.models",
        "LabelEncoder": "dew.flow.models",
        "TokenEncoder": "dew.flow.models",
        "DiffusionObjective": "dew.flow.objective",
        "FlowGRPOObjective": "dew.flow.grpo",
        "FlowRollout": "dew.flow.rollout",
        "RewardError": "dew.flow.draws",
        "FlowSource": "dew.flow.source",
        "FlowPacker": "dew.flow.packer",
        "group_advantages": "dew.flow.rollout",
        "FlowTrajectory": "dew.flow.trajectory",
        "sample_trajectory": "dew.flow.trajectory",
        "row_noise": "dew.flow.trajectory",
        "models": "dew.flow.models",
        "presets": "dew.flow.presets",
    },
)
