"""Re-grading a tool episode in a clean sandbox before its session is handed over.

``EnvironmentSource(regrade=...)`` takes a regrader (``collect(task, environment)``,
``grade(task, artifact, cancel=None)``) and wraps it in ``Regrade``, which lives in
``dew.sessions.regrade`` because the trainer's own ``EpisodeRollout`` re-grades with it too
(see that module for the protocol and the counts). Here a session whose clean reward
differs resolves INFRA_ERROR with no reward and a ``detail`` starting ``regrade rejected:``
(``regrade failed:`` when the regrader raised), so the scheduler's admission treats it as a
failed attempt (resubmitted, never trained). Sessions without a reward (errors,
cancellations) are not re-graded; a session cancelled while it is re-graded stops the
regrader (``cancel``) and resolves CANCELLED.
"""

from __future__ import annotations

from dew.sessions.regrade import COUNTS, Regrade

__all__ = ["COUNTS", "Regrade"]
